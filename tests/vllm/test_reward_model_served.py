"""A reward model used by URL: a real ``vllm serve`` of the tiny classifier (pooling runner),
scored through its ``/classify`` endpoint, in the caller's process through a ModelClient."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmrl.policies.remote_vllm import RemoteEngineError
from llmrl.scorers.client import ModelClient
from llmrl.scorers.policy_factory import ScoringPolicyFactory
from llmrl.scorers.reward_model import RewardModelFactory
from tests.support.reward_models import own_scores, score_requests
from tests.support.vllm_server import served_model
from tests.vllm.conftest import ATOL

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]

PAIRS = [("What is 2+2?", "4"), ("Hi", "Hello! How can I help?"), ("3*3?", "It is nine.")]


@pytest.fixture(scope="module")
def classifier_url(tiny_classifier_dir, tmp_path_factory) -> Iterator[str]:
    """``vllm serve`` of the tiny classifier (fp32, eager, pooling runner) as ``rm``."""
    log = tmp_path_factory.mktemp("vllm-serve-rm") / "server.log"
    arguments = ("--runner", "pooling", "--dtype", "float32", "--max-model-len", "512")
    with served_model(
        tiny_classifier_dir, log, *arguments, "--enforce-eager", "--served-model-name", "rm"
    ) as url:
        yield url


def _factory(url: str, folder, served: str = "rm") -> RewardModelFactory:
    engine = ScoringPolicyFactory(url=url, served_model=served, tokenizer=str(folder))
    return RewardModelFactory(engine=engine, max_length=256, timeout_s=60)


def test_served_scores_equal_the_classifiers_own_forward(
    classifier_url, tiny_classifier_dir, tokenizer
):
    client = ModelClient(
        role="reward_model", factory=_factory(classifier_url, tiny_classifier_dir), timeout_s=60
    )
    try:
        scores = client(score_requests(PAIRS))
    finally:
        client.close()
    expected = own_scores(tiny_classifier_dir, tokenizer, PAIRS)
    assert scores == pytest.approx(expected, abs=ATOL)
    assert client.metrics()["failures"] == 0


def test_a_wrong_served_model_is_an_error_naming_the_url(classifier_url, tiny_classifier_dir):
    scorer = _factory(classifier_url, tiny_classifier_dir, served="no-such-model")()
    with pytest.raises(RemoteEngineError, match=rf"{classifier_url}/classify answered 404"):
        scorer(score_requests(PAIRS[:1]))
