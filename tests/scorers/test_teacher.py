"""TeacherScorer: a teacher's log-probs of a student's sampled tokens equal the teacher's own
forward, in ref_log_probs' layout; a teacher whose tokenizer differs from the student's is
refused, naming both models and the first difference. (vLLM's CPU build as the teacher:
tests/vllm/test_model_scorers.py.)"""

from __future__ import annotations

import copy
import pickle
import re

import pytest
import torch

from llmrl.envs.transforms import RetrieveLogProb
from llmrl.models import tiny_model
from llmrl.policies import TransformersWrapper
from llmrl.scorers.policy_factory import ScoringPolicyFactory
from llmrl.scorers.teacher import (
    TEACHER_LOG_PROBS,
    TeacherFactory,
    TeacherScorer,
    TokenizerMismatchError,
    check_same_tokenizer,
    tokenizer_difference,
)
from tests.support.chats import history_batch
from tests.tolerances import log_prob_atol, max_abs


@pytest.fixture(scope="module")
def teacher(tokenizer):
    """Another tiny random Llama over SmolLM2's vocabulary (other weights than the student)."""
    return tiny_model(tokenizer, seed=5).requires_grad_(False)


@pytest.fixture(scope="module")
def sampled(tiny, tokenizer):
    """The student's batch: two sampled responses to each of the shared prompts."""
    student = TransformersWrapper(
        tiny, tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 8, "seed": 0}
    )
    with torch.no_grad():
        return student(history_batch()).reshape(-1)


@pytest.fixture(scope="module")
def word_level_dir(tmp_path_factory):
    """A tiny model folder whose tokenizer is a 6-word vocabulary (nothing like SmolLM2's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, "yes": 3, "no": 4, "maybe": 5}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    other = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    folder = tmp_path_factory.mktemp("word-level-teacher")
    tiny_model(other).save_pretrained(folder)
    other.save_pretrained(folder)
    return folder


def _teacher_forward(model, full: torch.Tensor) -> torch.Tensor:
    """``[lp(t1 | t0), ...]``: the teacher's own forward, log-softmax gathered."""
    with torch.no_grad():
        logits = model(full[None]).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, full[1:, None])[:, 0], max_abs(logits)


def test_teacher_scores_equal_its_own_forward_on_the_students_tokens(teacher, tokenizer, sampled):
    batch = TeacherScorer(TransformersWrapper(teacher, tokenizer))(sampled.clone(False))
    scores = batch[TEACHER_LOG_PROBS]
    fulls = batch["tokens"].as_list("full")
    responses = batch["tokens"].as_list("response")
    assistant = batch["masks"].as_list("assistant")
    for row, (full, response) in enumerate(zip(fulls, responses, strict=True)):
        expected, magnitude = _teacher_forward(teacher, full)
        atol = log_prob_atol(magnitude, teacher.config.vocab_size)
        got = scores.as_list("response")[row]
        assert got.shape == response.shape
        assert torch.allclose(got, expected[-len(response) :], atol=atol, rtol=0), row
        full_scores = scores.as_list("full")[row]
        assert (full_scores[~assistant[row]] == 0).all()  # only trained tokens carry a value
        assert torch.equal(full_scores[-len(response) :], got)
    # the student's own log-probs are not the teacher's: these are another model's scores
    student = sampled["log_probs"].as_list("response")[0]
    assert not torch.allclose(scores.as_list("response")[0], student, atol=0.1)


def test_teacher_log_probs_have_the_reference_layout(teacher, tokenizer, sampled):
    policy = TransformersWrapper(teacher, tokenizer)
    ours = TeacherScorer(policy)(sampled.clone(False))[TEACHER_LOG_PROBS]
    reference = RetrieveLogProb(policy).on_step(sampled.clone(False))["ref_log_probs"]
    for part in ("prompt", "response", "full"):
        for a, b in zip(ours.as_list(part), reference.as_list(part), strict=True):
            assert torch.equal(a, b), part


def test_the_factory_checks_the_tokenizer_then_builds_the_teacher(tiny_model_dir, sampled):
    factory = TeacherFactory(
        policy=ScoringPolicyFactory(model=str(tiny_model_dir)), student=str(tiny_model_dir)
    )
    scorer = pickle.loads(pickle.dumps(factory))()
    assert isinstance(scorer, TeacherScorer)
    batch = scorer(sampled.clone(False))
    assert len(batch[TEACHER_LOG_PROBS].as_list("response")) == len(sampled)
    scorer.close()


# ---------------------------------------------------------------------- tokenizer check
def test_a_teacher_with_another_vocabulary_is_refused_by_name(tiny_model_dir, word_level_dir):
    with pytest.raises(TokenizerMismatchError) as raised:
        check_same_tokenizer(str(tiny_model_dir), str(word_level_dir))
    message = str(raised.value)
    assert f"teacher {str(word_level_dir)!r}" in message
    assert f"student {str(tiny_model_dir)!r}" in message
    assert "vocabulary sizes differ (49152 tokens for the student, 6 for the teacher)" in message
    assert "token id 0 is '<|endoftext|>' for the student and '<pad>' for the teacher" in message


def test_the_factory_refuses_before_loading_the_teacher(tiny_model_dir, word_level_dir):
    factory = TeacherFactory(
        policy=ScoringPolicyFactory(model=str(word_level_dir)), student=str(tiny_model_dir)
    )
    with pytest.raises(TokenizerMismatchError, match=re.escape(str(word_level_dir))):
        factory()


def test_one_added_token_is_a_difference(tokenizer):
    teacher = copy.deepcopy(tokenizer)
    teacher.add_tokens(["<teacher_only>"])
    assert tokenizer_difference(tokenizer, teacher) == (
        "vocabulary sizes differ (49152 tokens for the student, 49153 for the teacher); "
        "token id 49152 is missing for the student and '<teacher_only>' for the teacher"
    )


def test_a_token_renamed_at_one_id_is_a_difference(tokenizer):
    teacher = copy.deepcopy(tokenizer)
    vocab = tokenizer.get_vocab()
    swapped = {token: index for token, index in vocab.items()}
    first, second = tokenizer.convert_ids_to_tokens([100, 101])
    swapped[first], swapped[second] = 101, 100
    teacher.get_vocab = lambda: swapped  # the same size, two ids exchanged
    assert tokenizer_difference(tokenizer, teacher) == (
        f"token id 100 is {first!r} for the student and {second!r} for the teacher"
    )


def test_another_end_of_sequence_token_is_a_difference(tokenizer):
    teacher = copy.deepcopy(tokenizer)
    teacher.eos_token = "<|endoftext|>"
    check_same_tokenizer(tokenizer, copy.deepcopy(tokenizer))  # the same: accepted
    with pytest.raises(TokenizerMismatchError, match="the eos_token differs") as raised:
        check_same_tokenizer(tokenizer, teacher, student_name="sft", teacher_name="grpo")
    assert "teacher 'grpo'" in str(raised.value) and "student 'sft'" in str(raised.value)
    assert "id 2 '<|im_end|>' for the student, id 0 '<|endoftext|>' for the teacher" in str(
        raised.value
    )
