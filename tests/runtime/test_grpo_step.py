"""`grpo_step` over stand-in parts (no model, no Ray): the metrics every composition reports, the
counters, the staleness and the versions it records; the audit's round trip before training and
its checksums after the push."""

from __future__ import annotations

import re
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from llmrl.collectors import DynamicSampler
from llmrl.config.grpo import AuditSettings
from llmrl.config.reward_shaping import RewardShapingSettings
from llmrl.data import Tokens
from llmrl.objectives import MCAdvantage
from llmrl.objectives.reward_shaping import RewardShaper
from llmrl.runtime.grpo_step import COUNTERS, grpo_step
from llmrl.train.audit import AuditError, StepAudit
from tests.support.stages import ROLLOUT_METRICS

G, PROMPTS = 2, 2

STEP_METRICS = {*ROLLOUT_METRICS, "weight_sync_bytes"}
"""What ``GRPORuntime.step`` and ``InProcessGRPO.step`` both report (the trainer's own metrics
and ``collector/*`` besides): the MLflow dashboards and the stage read these names."""


def batch_of(
    responses: list[list[int]], rewards: list[float], version: int, first_group: int = 0
) -> TensorDict:
    """Rows of whole groups of G: response tokens, rewards, the sampling version."""
    rows = len(responses)
    return TensorDict(
        {
            "tokens": Tokens.from_sequences(
                prompt=[torch.tensor([1, 2])] * rows,
                response=[torch.tensor(r) for r in responses],
            ),
            "reward": torch.tensor(rewards),
            "group_id": first_group + torch.arange(rows) // G,
            "policy_version": torch.full((rows,), version),
        },
        batch_size=[rows],
    )


SHAPING_METRICS = {
    "shaping/overlong_rows",
    "shaping/truncated_rows",
    "shaping/length_penalized_rows",
    "shaping/repetition_rows",
    "shaping/masked_rows",
    "shaping/reward_delta_mean",
}
"""What a step with ``reward_shaping`` on adds, whichever options are on."""


class FakeParts:
    """A composition whose engines answer fixed responses, trainer reports a loss, and push moves
    the version (optionally lagging by ``lag`` versions, as async sampling does)."""

    def __init__(self, lag: int = 0, audit: StepAudit | None = None) -> None:
        self.audit = audit
        self.shaping: RewardShaper | None = None
        self.sampler = DynamicSampler(MCAdvantage(G), PROMPTS, 0)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.trained_versions: deque[tuple[int, list[int]]] = deque()
        self.version, self.lag = 0, lag
        self.trained: list[tuple[TensorDictBase, int]] = []
        self.sync = SimpleNamespace(bytes=1234)
        self.batches = 0
        self.responses = [[5, 6, 7], [5], [8, 9], [9, 9, 9, 9]]

    @property
    def policy_version(self) -> int:
        return self.version

    def collect(self, round_index: int) -> TensorDictBase:
        version = max(0, self.version - self.lag)
        self.batches += 1
        return batch_of(self.responses, [0.0, 1.0, 1.0, 1.0], version, PROMPTS * self.batches)

    def train(self, trained: TensorDictBase, number: int) -> dict[str, float]:
        self.trained.append((trained, number))
        return {"loss": 0.5, "skipped_updates": 1.0}

    def push_weights(self) -> Any:
        self.version += 1
        return self.sync

    def collector_metrics(self) -> dict[str, float]:
        return {"collector/turns": 4.0}


def test_a_step_reports_every_metric_and_moves_the_counters():
    parts = FakeParts()
    batch, metrics = grpo_step(parts, 1)
    assert STEP_METRICS | {"loss", "collector/turns"} == set(metrics)
    assert batch.batch_size[0] == 4
    [(trained, number)] = parts.trained
    assert number == 1 and trained.get("advantage").shape[0] == 4
    assert metrics["response_tokens"] == 10 and metrics["response_length_mean"] == 2.5
    assert metrics["reward_mean"] == 0.75
    assert metrics["skipped_steps"] == 1 and parts.counters["skipped_steps"] == 1
    assert metrics["policy_version"] == 1 and metrics["staleness"] == 0
    assert metrics["weight_sync_bytes"] == 1234.0
    # the same float64 division as the step's (approx's default rel=1e-6 allows a rounding)
    assert metrics["tokens_per_second"] == pytest.approx(10 / metrics["generation_seconds"])
    assert list(parts.trained_versions) == [(0, [0, 0, 0, 0])]


def test_staleness_is_the_trainer_version_minus_the_oldest_sample():
    parts = FakeParts(lag=1)
    steps = [grpo_step(parts, number)[1] for number in (1, 2, 3)]
    assert [m["staleness"] for m in steps] == [0, 1, 1]
    assert [m["skipped_steps"] for m in steps] == [1, 2, 3]  # a run's counter, not a step's
    assert [t for t, _ in parts.trained_versions] == [0, 1, 2]


def test_a_step_without_a_push_reports_no_bytes():
    parts = FakeParts()
    parts.sync = None
    assert grpo_step(parts, 1)[1]["weight_sync_bytes"] == 0.0


def test_rewards_are_shaped_before_the_advantages_and_the_step_logs_it():
    # budget 4, buffer 2: responses of 3, 1, 2 (the buffer's start), 4 tokens get -0.5, 0, 0, -1
    parts = FakeParts()
    parts.shaping = RewardShaper(
        RewardShapingSettings(overlong_buffer={"length": 2, "penalty": 1.0}), max_new_tokens=4
    )
    batch, metrics = grpo_step(parts, 1)
    assert batch["reward"].tolist() == [-0.5, 1.0, 1.0, 0.0]
    assert metrics["reward_mean"] == 0.375 and metrics["shaping/reward_delta_mean"] == -0.375
    assert metrics["shaping/overlong_rows"] == 2.0 and metrics["shaping/masked_rows"] == 0.0
    assert {name for name in metrics if name.startswith("shaping/")} == SHAPING_METRICS
    # the second group's env rewards (1, 1) had no signal; shaped (1, 0) they have
    [(trained, _)] = parts.trained
    assert trained["advantage"].tolist() == pytest.approx([-1.0, 1.0, 1.0, -1.0], abs=1e-4)


class Tokenizer:
    """Token ``i`` decodes to ``chr(97 + i)``; ``"ab"`` encodes to one token, 26: the responses
    holding 0 then 1 do not come back the same."""

    def batch_decode(self, rows, **_):
        return ["".join(chr(97 + t) for t in row) for row in rows]

    def __call__(self, texts, **_):
        return {"input_ids": [self._encode(text) for text in texts]}

    def _encode(self, text):
        return [26 if part == "ab" else ord(part) - 97 for part in re.findall("ab|.", text)]


def test_the_audit_adds_its_metrics_and_stops_on_a_bad_checksum():
    audit = StepAudit(AuditSettings(), Tokenizer())
    parts = FakeParts(audit=audit)
    parts.responses = [[0, 1], [2], [0], [1, 0]]
    parts.sync = SimpleNamespace(bytes=8, version=1, checksum="c1", engine_checksums=("c1",))
    _, metrics = grpo_step(parts, 1)
    assert metrics["audit/token_roundtrip_mismatches"] == 1.0  # [0, 1] -> "ab" -> [26]
    assert metrics["audit/token_roundtrip_mismatch_fraction"] == 0.25
    assert metrics["audit/weight_checksum_mismatches"] == 0.0
    assert metrics["audit/weight_checksums_checked"] == 1.0
    parts.sync = SimpleNamespace(bytes=8, version=2, checksum="c2", engine_checksums=("c1",))
    with pytest.raises(AuditError, match="step 2: after pushing version 2, engine 0 holds"):
        grpo_step(parts, 2)


def test_a_round_trip_over_its_threshold_stops_the_step_before_training():
    audit = StepAudit(AuditSettings(max_roundtrip_mismatch_fraction=0.2), Tokenizer())
    parts = FakeParts(audit=audit)
    parts.responses = [[0, 1], [2], [0], [1, 0]]
    with pytest.raises(AuditError, match=r"step 1: 1 of 4 sampled responses \(25.0%\)"):
        grpo_step(parts, 1)
    assert parts.trained == []


def test_model_reward_metrics_average_the_scored_rows_and_count_the_failed():
    from llmrl.runtime.grpo_step import model_reward_metrics

    batch = TensorDict(
        {
            "judge_score": torch.tensor([0.2, 0.8, -1.0]),  # the third row got the fallback
            "judge_failed": torch.tensor([False, False, True]),
        },
        batch_size=[3],
    )
    # (0.2 + 0.8) / 2 over the rows the judge scored; the reward model wrote nothing
    assert model_reward_metrics(batch) == pytest.approx(
        {"judge/score_mean": 0.5, "judge/failures": 1.0}
    )


def test_the_in_process_loop_refuses_model_roles_it_cannot_start():
    from llmrl.config.grpo import GRPOConfig
    from llmrl.runtime.grpo_loop import InProcessGRPO
    from tests.support.configs import stage_config

    config = stage_config(
        GRPOConfig,
        "data.path=unused",
        rewards={"judge": {}},
        loss={"distillation": {"coeff": 1.0}},
    )
    with pytest.raises(ValueError, match=r"rewards\.judge, loss\.distillation: the model roles"):
        InProcessGRPO(config)
