"""The GRPO runtime with model roles (teacher, judge, reward model) on a local Ray, for the
runtime tests on the transformers engine (tests/runtime/test_model_roles_runtime.py) and on
vLLM's CPU build or by URL (tests/vllm/test_model_roles_vllm.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from llmrl.config.grpo import GRPOConfig
from llmrl.runtime import GRPORuntime, resolve_topology
from llmrl.runtime.ray_cluster import actor_runtime_env


def role_topology(**roles: dict) -> dict:
    """The local default topology on a quarter core per role (the student on the transformers
    engine, two env workers), plus the model ``roles`` (``teacher={...}``...)."""
    return {
        "inference": {"backend": "transformers", "cpus_per_engine": 0.25, "memory_gb": 1},
        "trainer": {"gpus": 0, "strategy": "single", "cpus": 0.25, "memory_gb": 2},
        "reference": {"placement": "none"},
        "env_workers": {"count": 2, "cpus_each": 0.25, "memory_gb": 1},
        **roles,
    }


def run_steps(
    config: GRPOConfig,
    steps: int,
    between: Callable[[GRPORuntime, int], None] | None = None,
) -> tuple[list[Any], list[dict[str, float]], GRPORuntime]:
    """``steps`` GRPO steps of a runtime built from ``config`` (``between(runtime, number)``
    after each), shut down at the end: every step's batch and metrics, and the runtime."""
    runtime = GRPORuntime(
        config=config, topology=resolve_topology(config), runtime_env=actor_runtime_env()
    )
    batches, metrics = [], []
    try:
        for number in range(1, steps + 1):
            batch, step_metrics = runtime.step(number)
            batches.append(batch)
            metrics.append(step_metrics)
            if between is not None:
                between(runtime, number)
    finally:
        runtime.shutdown()
    return batches, metrics, runtime


def assert_model_rewards_weighted(
    batches: list[Any], metrics: list[dict[str, float]], *, judge: float, reward_model: float
) -> None:
    """Every row of every step was scored by the judge and the reward model (none fell back),
    the judge's score is a verdict probability, and with ``rewards.task_weight`` 0 the reward
    is ``judge * judge_score + reward_model * reward_model_score``; the step's per-row
    metrics say the same."""
    for batch, step in zip(batches, metrics, strict=True):
        judge_score = batch["judge_score"].float()
        rm_score = batch["reward_model_score"].float()
        assert not batch["judge_failed"].any() and not batch["reward_model_failed"].any()
        assert ((judge_score >= 0) & (judge_score <= 1)).all()  # p(Yes) / (p(Yes) + p(No))
        expected = judge * judge_score + reward_model * rm_score
        torch.testing.assert_close(batch["reward"].float(), expected)
        assert step["judge/failures"] == 0 and step["reward_model/failures"] == 0
        assert step["judge/score_mean"] == pytest.approx(float(judge_score.mean()), abs=1e-6)
        assert step["reward_model/score_mean"] == pytest.approx(float(rm_score.mean()), abs=1e-6)
