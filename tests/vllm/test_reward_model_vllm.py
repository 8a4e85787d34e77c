"""The reward model on vLLM's CPU build (the pooling runner in this process): its scores equal
the classifier's own transformers forward on the same hand-built token ids."""

from __future__ import annotations

import pytest

from llmrl.scorers.policy_factory import ScoringPolicyFactory
from llmrl.scorers.reward_model import RewardModelFactory
from tests.support.reward_models import own_scores, score_requests
from tests.vllm.conftest import ATOL

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PAIRS = [("What is 2+2?", "4"), ("Hi", "Hello! How can I help?"), ("3*3?", "It is nine.")]


def test_vllm_pooling_scores_equal_the_classifiers_own_forward(tiny_classifier_dir, tokenizer):
    engine = ScoringPolicyFactory(model=str(tiny_classifier_dir), backend="vllm", dtype="float32")
    scorer = RewardModelFactory(engine=engine, max_length=256, batch_rows=2)()
    try:
        scores = scorer(score_requests(PAIRS))
    finally:
        scorer.close()
    expected = own_scores(tiny_classifier_dir, tokenizer, PAIRS)
    assert scores == pytest.approx(expected, abs=ATOL)
    assert max(expected) - min(expected) > 10 * ATOL  # the rows are told apart
