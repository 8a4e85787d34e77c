"""The model roles' server counters in a step's metrics (`ModelRoles.metrics`), without Ray
actors: stand-in servers answer ``metrics.remote()`` with their counters directly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llmrl.runtime.grpo_step import model_reward_metrics
from llmrl.runtime.model_roles import ModelRoles


def _server(**counters: float) -> SimpleNamespace:
    return SimpleNamespace(metrics=SimpleNamespace(remote=lambda: dict(counters)))


def test_server_counters_sum_over_servers_and_leave_the_row_failures_alone(monkeypatch):
    import torch
    from tensordict import TensorDict

    # the stand-ins answer in place, within any deadline
    monkeypatch.setattr("llmrl.runtime.model_roles.wait_for", lambda refs, timeout_s, what: refs)
    first = {"requests": 2.0, "rows": 4.0, "batches": 2.0, "latency_s_total": 1.0}
    roles = ModelRoles(
        servers={
            "judge": [_server(**first, failures=2.0), _server(**first, failures=0.0)],
        }
    )
    metrics = roles.metrics()
    assert metrics == pytest.approx(
        {
            "judge/requests": 4.0,
            "judge/rows": 8.0,
            "judge/batches": 4.0,
            "judge/call_failures": 2.0,  # calls that raised
            "judge/latency_s": 0.5,  # 2 s over 4 requests
        }
    )
    # the step merges the rows' metrics, then these: the servers' failed calls must not hide
    # how many rows got the fallback reward (here one judge answer without a verdict)
    batch = TensorDict(
        {"judge_score": torch.tensor([0.7, 0.0]), "judge_failed": torch.tensor([False, True])},
        batch_size=[2],
    )
    step = {**model_reward_metrics(batch), **metrics}
    assert step["judge/failures"] == 1.0 and step["judge/score_mean"] == pytest.approx(0.7)
