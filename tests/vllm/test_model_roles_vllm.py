"""The teacher, judge and reward model in the GRPO runtime on vLLM's CPU build: placed (each a
vLLM engine in its own Ray actor, no GPU) and served by URL (``vllm serve`` processes).

The student is the tiny random Llama on the transformers engine; the teacher (``loss.
distillation``) and the judge are the real SmolLM2 (the student's tokenizer), the reward model
the tiny classifier. Two steps of 2 prompts x 2 samples of 6 tokens each. Besides the runtime's
own bookkeeping, every signal must equal what the transformers forward of the same model gives
for the same rows and tokens: the teacher's reverse KL in the loss, and each row's
judge and reward-model score (so they reached the rows they belong to, through the env workers'
batching and the servers').

Cost on 2 cores (measured): the placed runtime 105-170 s (three engines started one after the
other; at its peak the machine used 12.4 GiB: per SmolLM2 role ~4 GB RSS with a 0.5 GiB KV
cache, the classifier's ~3 GB), the served one 85-100 s with its two servers' start (10.5 GiB)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from llmrl.config.grpo import GRPOConfig
from llmrl.policies import TransformersWrapper
from llmrl.scorers import RewardModelFactory, ScoringPolicyFactory
from llmrl.scorers.judge import JudgeScorer
from llmrl.scorers.requests import requests_from_batch
from tests.support.configs import tiny_grpo_config
from tests.support.model_role_runs import assert_model_rewards_weighted, role_topology, run_steps
from tests.support.vllm_server import served_model
from tests.vllm.conftest import ATOL, hf_log_probs

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("isolated_stage"),
]

STEPS = 2
ROWS = 2 * 2  # prompts_per_step x num_samples
JUDGE_WEIGHT, RM_WEIGHT = 0.5, 2.0
MAX_LENGTH = 512  # the reward model's (and its served max-model-len)


def _config(data: Path, student: Path, **roles: dict) -> GRPOConfig:
    """Every signal from the models: task_weight 0 for the reward and the distillation."""
    rewards = {
        "task_weight": 0.0,
        "judge": {"weight": JUDGE_WEIGHT},
        "reward_model": {"weight": RM_WEIGHT, "max_length": MAX_LENGTH},
    }
    return tiny_grpo_config(
        data,
        student,
        topology=role_topology(**roles),
        rewards=rewards,
        loss={"distillation": {"coeff": 1.0, "task_weight": 0.0}},
    )


def _vllm_engine(model: str | Path) -> dict:
    """A role on one vLLM CPU engine in a Ray actor: eager, a half-GiB KV cache."""
    return {"model": str(model), "backend": "vllm", "gpus_per_engine": 0, "dtype": "float32",
            "cpus_per_engine": 0.25, "memory_gb": 4, "cpu_kv_cache_gb": 0.5,
            "enforce_eager": True}  # fmt: skip


def _assert_model_signals(
    config: GRPOConfig, batches: list, metrics: list[dict], smollm2, tokenizer, classifier: Path
) -> None:
    """Two steps trained on the models' signals, each of them as SmolLM2's and the classifier's
    own transformers forward give it for the same rows and tokens."""
    assert [m["policy_version"] for m in metrics] == [1, 2]
    assert_model_rewards_weighted(batches, metrics, judge=JUDGE_WEIGHT, reward_model=RM_WEIGHT)
    for batch, step in zip(batches, metrics, strict=True):
        # the loss read the teacher's log-probs of every sampled token (every row is trained)
        sampled = batch["log_probs"].as_list("response")
        full = batch["tokens"].as_list("full")
        teacher = torch.cat(
            [
                hf_log_probs(smollm2, sequence.tolist())[-len(lp) :]
                for sequence, lp in zip(full, sampled, strict=True)
            ]
        )
        # the mean over the trained tokens of log p_sampler - log p_teacher
        kl = float((torch.cat(sampled).float() - teacher).mean())
        assert step["distill_reverse_kl"] == pytest.approx(kl, abs=ATOL)
        # SmolLM2 and a random Llama disagree (measured 6.5 and 6.0 nats a token)
        assert math.isfinite(kl) and abs(kl) > 0.1
    # the judge's and the reward model's scores reached the rows they belong to
    requests = [request for batch in batches for request in requests_from_batch(batch)]
    judge_settings = config.rewards.judge
    assert judge_settings is not None
    judged = JudgeScorer(TransformersWrapper(smollm2, tokenizer), judge_settings)(requests)
    scores = torch.cat([batch["judge_score"].float() for batch in batches]).tolist()
    assert scores == pytest.approx(judged, abs=ATOL)
    rm_scorer = RewardModelFactory(
        engine=ScoringPolicyFactory(model=str(classifier)), max_length=MAX_LENGTH
    )()
    try:
        rm_scores = rm_scorer(requests)
    finally:
        rm_scorer.close()
    scores = torch.cat([batch["reward_model_score"].float() for batch in batches]).tolist()
    assert scores == pytest.approx(rm_scores, abs=ATOL)


def test_the_three_roles_on_vllm_engines_in_ray_actors(
    local_ray, arithmetic_data, tiny_model_dir, model_dir, tiny_classifier_dir, hf_model, tokenizer
):
    config = _config(
        arithmetic_data,
        tiny_model_dir,
        teacher=_vllm_engine(model_dir),
        judge=_vllm_engine(model_dir),
        reward_model=_vllm_engine(tiny_classifier_dir),
    )
    batches, metrics, _ = run_steps(config, STEPS)
    # one teacher request per step with every trained row; the judge's and the reward model's
    # servers got both env workers' requests, every row once
    assert [m["teacher/requests"] for m in metrics] == [1.0, 2.0]
    assert [m["teacher/rows"] for m in metrics] == [ROWS, 2 * ROWS]
    for role in ("teacher", "judge", "reward_model"):
        assert all(m[f"{role}/call_failures"] == 0 for m in metrics), role
        assert all(m[f"{role}/latency_s"] > 0 for m in metrics), role
    assert metrics[-1]["judge/rows"] == metrics[-1]["reward_model/rows"] == STEPS * ROWS
    assert metrics[-1]["judge/requests"] == metrics[-1]["reward_model/requests"] == STEPS * 2
    _assert_model_signals(config, batches, metrics, hf_model, tokenizer, tiny_classifier_dir)


@pytest.fixture(scope="module")
def served(model_dir, tiny_classifier_dir, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """The URLs of ``vllm serve`` of SmolLM2 and of the tiny classifier (its pooling runner),
    both fp32 and eager, each under its folder's path as its model name."""
    logs = tmp_path_factory.mktemp("vllm-serve")
    fp32_eager = ("--dtype", "float32", "--enforce-eager")
    with (
        served_model(model_dir, logs / "smollm2.log", *fp32_eager, "--max-model-len", "1024") as lm,
        served_model(
            tiny_classifier_dir,
            logs / "classifier.log",
            *(*fp32_eager, "--runner", "pooling", "--max-model-len", str(MAX_LENGTH)),
        ) as classifier,
    ):
        yield lm, classifier


def test_the_three_roles_served_by_url(
    local_ray,
    arithmetic_data,
    tiny_model_dir,
    model_dir,
    tiny_classifier_dir,
    served,
    hf_model,
    tokenizer,
):
    smollm2_url, classifier_url = served
    config = _config(
        arithmetic_data,
        tiny_model_dir,
        # one server for the teacher (its only model) and the judge (named: its tokenizer too)
        teacher={"url": smollm2_url},
        judge={"url": smollm2_url, "served_model": str(model_dir)},
        reward_model={"url": classifier_url, "served_model": str(tiny_classifier_dir)},
    )
    batches, metrics, runtime = run_steps(config, STEPS)
    # nothing placed: no servers, so no server counters; the roles are their urls
    for role in ("teacher", "judge", "reward_model"):
        assert f"{role}/requests" not in metrics[-1] and f"{role}/rows" not in metrics[-1]
    params = runtime.runtime_params()
    assert params["runtime.teacher"] == params["runtime.judge"] == smollm2_url
    assert params["runtime.reward_model"] == classifier_url
    _assert_model_signals(config, batches, metrics, hf_model, tokenizer, tiny_classifier_dir)
