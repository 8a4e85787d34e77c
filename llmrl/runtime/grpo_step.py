"""`grpo_step`: one GRPO iteration over the parts that compose it, wherever they run.

The same function is the step of :class:`~llmrl.runtime.GRPORuntime` (engines, env workers and
trainer ranks as Ray actors), of :class:`~llmrl.runtime.grpo_loop.InProcessGRPO` (the same parts
in one process: a researcher's script, the benchmarks' one-process contender) and so of every
benchmark built on either. Each
composition only builds its :class:`StepParts`; what a step does, and the metrics it reports,
are here::

    rounds = ShapedRounds(parts.collect, parts.shaping)  # each round's rewards shaped
    sampled = parts.sampler.sample(rounds)          # prompts x G, rewards, advantages (rounds)
    audit.token_round_trip(sampled.batch)           # responses decoded and encoded again
    metrics = parts.train(sampled.trained, number)  # ranks: loss, backward, optimizer step
                                                    #   (the log-prob gap checked before it)
    sync = parts.push_weights()                     # trainer -> engines; version + 1
    audit.weight_checksums(sync)                    # each engine's weights = the trainer's?

The audit (:mod:`llmrl.train.audit`, ``audit`` in the config) raises
:class:`~llmrl.train.audit.AuditError` naming the step, the engine and the gap when a threshold
is exceeded, before the optimizer step trains on the batch (round trip, log-prob gap) or before
the next step samples from the engine (checksums).

Metrics of a step: the rollout statistics (:func:`rollout_metrics`), dynamic sampling's counts
(:mod:`llmrl.collectors.dynamic_sampling`), reward shaping's ``shaping/*`` when on
(``shaping/overlong_rows``, ``shaping/truncated_rows``, ``shaping/length_penalized_rows``,
``shaping/repetition_rows``: final replies each option touched; ``shaping/masked_rows``: rows
left out of the loss; ``shaping/reward_delta_mean``: mean shaped - env reward, so the env's
mean is ``reward_mean`` minus it: :mod:`llmrl.objectives.reward_shaping`), the trainer's
(losses, ``grad_norm``, ``lr``, per-phase seconds, ``peak_memory_mb``), ``generation_seconds``
(waiting for the batches),
``training_seconds``, ``weight_sync_seconds``, ``weight_sync_bytes`` (a LoRA adapter push's
bytes under ``lora.sync: adapter``, with ``weight_sync_merged_bytes``: the merged model's, for
comparison), the run's counters
(``skipped_steps``, ``dropped_zero_std_groups``, ``underfilled_steps``), the model rewards'
``<role>/score_mean`` and ``<role>/failures`` (:func:`model_reward_metrics`), ``policy_version``
(after the push), ``staleness`` (trainer version - oldest sample's), the collector's
``collector/*``, ``tokens_per_second`` (response tokens / generation seconds), and the audit's
``audit/*``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import torch
from tensordict import TensorDictBase

from llmrl.collectors import DynamicSampler
from llmrl.core.faults import fault_point
from llmrl.objectives.reward_shaping import RewardShaper, ShapedRounds

if TYPE_CHECKING:
    from llmrl.train.audit import StepAudit

COUNTERS = ("skipped_steps", "dropped_zero_std_groups", "underfilled_steps")
"""The run's counters every step reports (and checkpoints keep)."""


class StepParts(Protocol):
    """What :func:`grpo_step` needs of a GRPO composition."""

    sampler: DynamicSampler
    """Draws rounds with :meth:`collect` and sets the advantages (dynamic sampling)."""
    counters: dict[str, int]
    """:data:`COUNTERS`, updated by each step."""
    trained_versions: deque[tuple[int, list[int]]]
    """(trainer version, every sample's ``policy_version``) of each step, appended by it."""
    audit: StepAudit | None
    """The driver's half of the consistency audit; None: off."""
    shaping: RewardShaper | None
    """``reward_shaping`` of each round's batch before its advantages; None: off."""

    @property
    def policy_version(self) -> int:
        """The version of the weights the engines hold (= optimizer steps taken)."""

    def collect(self, round_index: int) -> TensorDictBase:
        """The next batch of one round (``round_index`` > 0: a resample round)."""

    def train(self, trained: TensorDictBase, number: int) -> dict[str, float]:
        """Learn from the trained rows (``advantage`` set); the trainer's metrics, with
        ``skipped_updates``."""

    def push_weights(self) -> Any:
        """Send the trainer's weights to the engines (version + 1); the push's
        ``WeightSyncStats`` (``bytes``), or None."""

    def collector_metrics(self) -> dict[str, float]:
        """The collector's counters (``collector/*``)."""


def grpo_step(parts: StepParts, number: int) -> tuple[TensorDictBase, dict[str, float]]:
    """GRPO step ``number`` (1-based) over ``parts``: every row sampled for it (all rounds of
    dynamic sampling) and the step's metrics (see the module docstring)."""
    fault_point("generate", number)
    tick = time.perf_counter()
    rounds = ShapedRounds(parts.collect, parts.shaping)  # rewards shaped before advantages
    sampled = parts.sampler.sample(rounds)  # engines decode: most of a CPU step
    batch, trained = sampled.batch, sampled.trained
    seconds = {"generation_seconds": time.perf_counter() - tick}
    metrics = {**rollout_metrics(batch), **sampled.metrics, **rounds.metrics()}
    counters = parts.counters
    counters["underfilled_steps"] += int(sampled.underfilled)
    trainer_version = parts.policy_version  # the weights being trained: before this step's push
    versions = [int(v) for v in batch["policy_version"].reshape(-1).tolist()]
    parts.trained_versions.append((trainer_version, versions))
    audit = parts.audit
    if audit is not None:  # its cost: docs/measurements.md#the-consistency-audits-cost
        metrics.update(audit.token_round_trip(batch, number))

    tick = time.perf_counter()
    if trained is not None and trained.batch_size[0] > 0:  # forward, backward, optimizer step
        result = parts.train(trained, number)
        counters["skipped_steps"] += int(result.pop("skipped_updates"))
        metrics.update(result)
    seconds["training_seconds"] = time.perf_counter() - tick

    tick = time.perf_counter()
    sync = parts.push_weights()  # the whole model (or a LoRA adapter), trainer -> engines
    seconds["weight_sync_seconds"] = time.perf_counter() - tick
    if audit is not None:  # compares the checksums the push returned
        metrics.update(audit.weight_checksums(sync, number))

    stats = parts.sampler.advantage.stats
    counters["dropped_zero_std_groups"] = int(stats.get("dropped_zero_std_groups", 0))
    metrics.update(
        seconds,
        **counters,
        policy_version=parts.policy_version,
        staleness=trainer_version - min(versions),
        weight_sync_bytes=float(sync.bytes) if sync is not None else 0.0,
    )
    if getattr(sync, "merged_bytes", 0):  # an adapter push: what the merged one would carry
        metrics["weight_sync_merged_bytes"] = float(sync.merged_bytes)
    metrics.update(parts.collector_metrics())
    metrics["tokens_per_second"] = metrics["response_tokens"] / max(
        seconds["generation_seconds"], 1e-9
    )
    return batch, metrics


def rollout_metrics(batch: TensorDictBase) -> dict[str, float]:
    """Reward, accuracy and length statistics of a collected batch."""
    reward = batch["reward"].float()
    lengths = torch.tensor([len(r) for r in batch["tokens"].as_list("response")], dtype=torch.float)
    return {
        "reward_mean": float(reward.mean()),
        "reward_std": float(reward.std()) if reward.numel() > 1 else 0.0,
        "response_length_mean": float(lengths.mean()),
        "response_tokens": float(lengths.sum()),
        "accuracy": _mean_or_nan(batch.get("correct", None)),
        "format_rate": _mean_or_nan(batch.get("formatted", None)),
        **model_reward_metrics(batch),
    }


def model_reward_metrics(batch: TensorDictBase) -> dict[str, float]:
    """``<name>/score_mean`` (over the rows it scored) and ``<name>/failures`` (rows that got
    the fallback reward) of every scored part the env workers wrote as ``<name>_score`` and
    ``<name>_failed``: the model rewards (``reward_model``, ``judge``:
    :class:`~llmrl.envs.transforms.model_reward.ModelReward`) and each reward function of a
    task made of several (:class:`~llmrl.envs.transforms.task_reward.TaskReward`); and
    ``task/failures``, the rows whose task reward came from the fallback because the user's
    scoring code failed."""
    metrics = {}
    keys = {str(key) for key in batch.keys()}  # noqa: SIM118 (a tensordict)
    for key in sorted(keys):
        name = key.removesuffix("_failed")
        if name == key:
            continue
        failed = batch.get(key).reshape(-1).bool()
        if f"{name}_score" in keys:
            scored = batch.get(f"{name}_score").reshape(-1).float()[~failed]
            metrics[f"{name}/score_mean"] = float(scored.mean()) if scored.numel() else math.nan
        metrics[f"{name}/failures"] = float(failed.sum())
    return metrics


def _mean_or_nan(values: torch.Tensor | None) -> float:
    return float(values.float().mean()) if values is not None else math.nan
