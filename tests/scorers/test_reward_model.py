"""RewardModelScorer on the transformers backend: scores equal the classifier's own forward on
hand-built token ids (one and two labels, padded batches, left truncation, the plain-text
rendering), and folders that are no usable classifier are refused by name."""

from __future__ import annotations

import pickle

import pytest

from llmrl.policies.remote_vllm import RemoteEngineError
from llmrl.scorers.policy_factory import ScoringPolicyFactory
from llmrl.scorers.reward_model import NotAClassifierError, RewardModelFactory
from tests.support.reward_models import (
    SYSTEM,
    chat_ids,
    own_logits,
    own_scores,
    save_classifier,
    score_requests,
)

# fp32 logits (|x| < 1) of a 2-layer model: a padded batch computes the same sums through other
# kernels (batched matmuls, a masked softmax), a few float32 roundings (1e-7 each) apart; a
# wrong token or row moves a logit by 1e-2 or more.
FP32_ATOL = 1e-5
PAIRS = [
    ("What is 2+2?", "4"),
    ("Name a colour of the sky on a clear day, in one word please.", "Blue, mostly."),
    ("Hi", "Hello! How can I help you today? Ask me anything at all."),
]


def _factory(folder, **options) -> RewardModelFactory:
    return RewardModelFactory(engine=ScoringPolicyFactory(model=str(folder)), **options)


def test_scores_equal_the_classifiers_own_forward_in_padded_batches(tiny_classifier_dir, tokenizer):
    ids = [chat_ids(tokenizer, SYSTEM, p, r) for p, r in PAIRS]
    assert len({len(s) for s in ids}) == 3  # three lengths: batches of two are padded
    expected = own_scores(tiny_classifier_dir, tokenizer, PAIRS)
    scorer = pickle.loads(pickle.dumps(_factory(tiny_classifier_dir, batch_rows=2)))()
    assert scorer(score_requests(PAIRS)) == pytest.approx(expected, abs=FP32_ATOL)
    assert len(set(expected)) == 3  # a constant or a swapped row would show


def test_two_labels_score_the_difference_of_the_logits(tmp_path, tokenizer):
    folder = save_classifier(tmp_path / "rm2", tokenizer, num_labels=2, seed=1)
    ids = [chat_ids(tokenizer, SYSTEM, p, r) for p, r in PAIRS]
    expected = [b - a for a, b in own_logits(folder, ids)]
    assert _factory(folder)()(score_requests(PAIRS)) == pytest.approx(expected, abs=FP32_ATOL)


def test_long_texts_keep_their_end(tiny_classifier_dir, tokenizer):
    ids = chat_ids(tokenizer, SYSTEM, *PAIRS[1])
    [[expected]] = own_logits(tiny_classifier_dir, [ids[-9:]])
    [[whole]] = own_logits(tiny_classifier_dir, [ids])
    [score] = _factory(tiny_classifier_dir, max_length=9)()(score_requests(PAIRS[1:2]))
    assert score == pytest.approx(expected, abs=FP32_ATOL)
    assert abs(whole - expected) > 1e-4


def test_a_tokenizer_without_a_chat_template_reads_plain_text(tmp_path, tokenizer):
    folder = save_classifier(tmp_path / "plain", tokenizer, seed=2)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    plain = tokenizer.from_pretrained(folder)
    plain.chat_template = None
    plain.save_pretrained(folder)
    assert not _factory(folder).engine.load_tokenizer().chat_template
    texts = [f"{SYSTEM}\n\n{p}\n\n{r}" for p, r in PAIRS]
    expected = [row[0] for row in own_logits(folder, [plain(t)["input_ids"] for t in texts])]
    assert _factory(folder)()(score_requests(PAIRS)) == pytest.approx(expected, abs=FP32_ATOL)


def test_a_causal_lm_folder_is_refused_by_name(tiny_model_dir):
    with pytest.raises(NotAClassifierError) as refused:
        _factory(tiny_model_dir)()
    message = str(refused.value)
    assert str(tiny_model_dir) in message and "LlamaForCausalLM" in message
    assert "not a sequence classifier" in message


def test_more_than_two_labels_are_refused_by_name(tmp_path, tokenizer):
    folder = save_classifier(tmp_path / "rm3", tokenizer, num_labels=3)
    with pytest.raises(NotAClassifierError, match=rf"{folder} has 3 labels; a reward model has 1"):
        _factory(folder)()


def test_an_unreachable_url_is_named():
    factory = RewardModelFactory(
        engine=ScoringPolicyFactory(url="http://127.0.0.1:9", tokenizer="smollm2-135m-instruct"),
        timeout_s=5,
    )
    with pytest.raises(RemoteEngineError, match=r"http://127\.0\.0\.1:9/v1/models"):
        factory()
