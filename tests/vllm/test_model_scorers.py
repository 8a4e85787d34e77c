"""Model roles on vLLM's CPU build: the real SmolLM2 as judge and as distillation teacher,
built by ScoringPolicyFactory (an in-process VLLMEngine), scoring what the same model's
transformers forward computes, and what the transformers engine's scorers give."""

from __future__ import annotations

import pytest
import torch

from llmrl.config.model_signals import JudgeSettings
from llmrl.policies import TransformersWrapper
from llmrl.policies.vllm_wrapper import vLLMWrapper
from llmrl.scorers.judge import JudgeScorer, judge_message
from llmrl.scorers.policy_factory import ScoringPolicyFactory, close_policy
from llmrl.scorers.teacher import TEACHER_LOG_PROBS, TeacherScorer
from tests.support.chats import history_batch
from tests.vllm.conftest import ATOL, assert_close_rows, hf_log_probs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARITHMETIC = [
    ("What is 7 + 5?", "12", "7 + 5 = 12. The answer is 12.", "7 + 5 = 15. The answer is 15."),
    ("What is 9 - 3?", "6", "9 - 3 = 6. The answer is 6.", "9 - 3 = 2. The answer is 2."),
    ("What is 4 * 3?", "12", "4 * 3 = 12. The answer is 12.", "4 * 3 = 7. The answer is 7."),
]


@pytest.fixture(scope="module")
def vllm_policy(model_dir):
    """The role's policy as the factory builds it for backend vllm: one engine per module."""
    factory = ScoringPolicyFactory(
        model=model_dir, backend="vllm", dtype="float32", max_model_len=1024
    )
    policy = factory()
    yield policy
    close_policy(policy)


def _requests() -> list[dict]:
    return [
        {"prompt": [{"role": "user", "content": question}], "response": answer, "reference": ref}
        for question, ref, right, wrong in ARITHMETIC
        for answer in (right, wrong)
    ]


def _verdict_log_probs(hf_model, tokenizer, request, settings) -> torch.Tensor:
    """log p(Yes), log p(No) as the judge's first answer token, by a plain forward."""
    message = judge_message(request, settings.template)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    words = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in settings.verdicts]
    assert all(len(w) == 1 for w in words)
    with torch.no_grad():
        logits = hf_model(torch.tensor([list(ids)])).logits[0, -1].float()
    return logits.log_softmax(-1)[[w[0] for w in words]].double()


def test_the_factory_builds_a_vllm_policy(vllm_policy):
    assert isinstance(vllm_policy, vLLMWrapper)
    assert len(vllm_policy.engines) == 1


def test_vllm_judge_scores_the_verdict_softmax_of_the_models_forward(
    vllm_policy, hf_model, tokenizer
):
    settings = JudgeSettings()
    requests = _requests()
    vllm_judge = JudgeScorer(vllm_policy, settings)
    hf_judge = JudgeScorer(TransformersWrapper(hf_model, tokenizer), settings)
    scores, hf_scores = vllm_judge(requests), hf_judge(requests)
    for request, score, hf_score in zip(requests, scores, hf_scores, strict=True):
        verdicts = _verdict_log_probs(hf_model, tokenizer, request, settings)
        assert verdicts.exp().sum() >= settings.min_verdict_prob
        # |d score| <= (|d lp_yes| + |d lp_no|) / 4 for score = p_yes / (p_yes + p_no)
        assert score == pytest.approx(verdicts.softmax(-1)[0].item(), abs=ATOL / 2)
        assert score == pytest.approx(hf_score, abs=ATOL / 2)
    # SmolLM2-135M barely tells right from wrong (~0.01 apart), but deterministically so
    right, wrong = scores[0::2], scores[1::2]
    assert sum(right) / len(right) > sum(wrong) / len(wrong)


def test_vllm_judge_in_parse_mode_answers_greedily(vllm_policy, hf_model, tokenizer):
    settings = JudgeSettings(mode="parse", max_new_tokens=4)
    requests = _requests()[:2]
    vllm_judge = JudgeScorer(vllm_policy, settings)
    answers = vllm_judge.answers(requests)
    for request, answer in zip(requests, answers, strict=True):
        verdicts = _verdict_log_probs(hf_model, tokenizer, request, settings)
        top = verdicts.argmax().item()
        # where the model clearly prefers one verdict word, the greedy answer starts with it
        if abs(verdicts[0] - verdicts[1]) > 10 * ATOL and verdicts.exp().max() > 0.3:
            assert answer.startswith(list(settings.verdicts)[top]), answer
    assert vllm_judge(requests) == [
        JudgeScorer(TransformersWrapper(hf_model, tokenizer), settings)(requests)[i]
        for i in range(len(requests))
    ]


def test_vllm_teacher_scores_equal_the_models_forward(vllm_policy, hf_model, tokenizer):
    student = TransformersWrapper(
        hf_model, tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 8, "seed": 0}
    )
    with torch.no_grad():
        batch = student(history_batch()).reshape(-1)
    vllm_scores = TeacherScorer(vllm_policy)(batch.clone(False))[TEACHER_LOG_PROBS]
    hf_scores = TeacherScorer(TransformersWrapper(hf_model, tokenizer))(batch.clone(False))[
        TEACHER_LOG_PROBS
    ]
    responses = batch["tokens"].as_list("response")
    expected = [
        hf_log_probs(hf_model, full.tolist())[-len(response) :]
        for full, response in zip(batch["tokens"].as_list("full"), responses, strict=True)
    ]
    assert_close_rows(expected, vllm_scores.as_list("response"))
    assert_close_rows(expected, hf_scores.as_list("response"))
    assistant = batch["masks"].as_list("assistant")
    for full, mask in zip(vllm_scores.as_list("full"), assistant, strict=True):
        assert (full[~mask] == 0).all()
