"""The consistency audit of every GRPO step: does the trainer learn from what the engines sampled?

Three checks, each logged as ``audit/*`` metrics and each able to stop the run (``audit`` in
:class:`~llmrl.config.grpo.GRPOConfig`) with an :class:`AuditError` that names the step, the
engine and the gap:

- **log-prob gap** (trainer ranks, :class:`LogProbGapTally`): the sampler's log-probs of the
  sampled tokens against the trainer's (:mod:`llmrl.objectives.consistency`): per engine the
  mean and max ``|trainer - sampler|`` and the k3 estimate of ``KL(sampler || trainer)``, nats
  per token. The trainer's side is its loss forward in the step's first pass over the batch,
  so the audit costs no forward of its own; each minibatch is checked after its forwards and
  before its optimizer step, on every rank alike (the numbers are reduced over the ranks
  first), so no optimizer step uses data over a threshold. Those log-probs are the weights'
  before any update of the step with the default one minibatch, or when the batch carries
  anchors (``loss.tis_cap`` with several optimizer steps); with several minibatches and no
  anchors, minibatch ``k``'s come after ``k - 1`` updates of the step and hold that (small)
  drift too, as an async run's hold the policy's change over the samples' staleness.
- **weight checksums** (driver, :meth:`StepAudit.weight_checksums`): after each push, every
  engine's checksum of the weights it holds against the checksum of what the trainer sent.
  The next step would sample from an engine that differs, so the run stops before it.
- **token round trip** (driver, :meth:`StepAudit.token_round_trip`): each sampled response's
  tokens decoded and the text encoded again; a response whose tokens come back different
  counts. Checked before the step trains.

Metrics: ``audit/logprob_gap_mean``, ``audit/logprob_gap_max``, ``audit/kl``,
``audit/logprob_tokens`` (and ``audit/engine_<i>/...`` of each engine when there are several),
``audit/weight_checksum_mismatches`` of ``audit/weight_checksums_checked``,
``audit/token_roundtrip_mismatches``, ``audit/token_roundtrip_mismatch_fraction``, and what the
audit took: ``audit/trainer_seconds``, ``audit/driver_seconds``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from llmrl.objectives.consistency import ENGINE_KEY, GAP_COLUMNS
from llmrl.train import distributed

if TYPE_CHECKING:
    from llmrl.config.grpo import AuditSettings


class AuditError(RuntimeError):
    """The consistency audit stopped the run: the message names the step, the engine and the
    gap; ``metrics`` holds the step's ``audit/*`` numbers (logged before the run fails)."""

    def __init__(
        self, message: str, step: int, engine: int | None, metrics: dict[str, float]
    ) -> None:
        super().__init__(message)
        self.step, self.engine, self.metrics = step, engine, dict(metrics)

    def __reduce__(self) -> tuple[Any, ...]:  # crosses Ray from a trainer rank
        return type(self), (str(self), self.step, self.engine, self.metrics)


@dataclass(frozen=True)
class LogProbGap:
    """The log-prob gap of one step, per engine (index = engine), over every rank."""

    mean: list[float]
    max: list[float]
    kl: list[float]
    tokens: list[int]

    def metrics(self) -> dict[str, float]:
        """``audit/logprob_gap_mean``, ``_max``, ``audit/kl``, ``audit/logprob_tokens``; each
        engine's too when there are several."""
        tokens = sum(self.tokens)
        out = {
            "audit/logprob_gap_mean": _weighted(self.mean, self.tokens),
            "audit/logprob_gap_max": max(self.max, default=0.0),
            "audit/kl": _weighted(self.kl, self.tokens),
            "audit/logprob_tokens": float(tokens),
        }
        if len(self.tokens) > 1:
            for engine, (mean, largest, kl) in enumerate(
                zip(self.mean, self.max, self.kl, strict=True)
            ):
                out[f"audit/engine_{engine}/logprob_gap_mean"] = mean
                out[f"audit/engine_{engine}/logprob_gap_max"] = largest
                out[f"audit/engine_{engine}/kl"] = kl
        return out

    def check(self, settings: AuditSettings, step: int, metrics: dict[str, float]) -> None:
        """Raise :class:`AuditError` for the first engine over a threshold."""
        bounds = (
            ("mean", self.mean, settings.max_logprob_gap_mean, "on average"),
            ("max", self.max, settings.max_logprob_gap_max, "at one token"),
        )
        for name, values, bound, how in bounds:
            for engine, value in enumerate(values):
                if bound is not None and value > bound:
                    raise AuditError(
                        f"consistency audit, step {step}: engine {engine}'s sampling "
                        f"log-probs differ from the trainer's by {value:.4g} nats {how} over its "
                        f"{self.tokens[engine]} sampled tokens (audit/logprob_gap_{name}; "
                        f"audit.max_logprob_gap_{name}: {bound:g}). The engine does not sample "
                        "from the weights being trained (a wrong or corrupted weight, another "
                        "precision or kernel, stale weights); stopped before an optimizer step "
                        "used it",
                        step,
                        engine,
                        metrics,
                    )


class LogProbGapTally:
    """One rank's gap rows of step ``step`` (:func:`~llmrl.objectives.consistency.
    logprob_gap_rows`, with the engine of each row); :meth:`check` reduces them over the ranks
    and holds the step's ``metrics``."""

    def __init__(self, settings: AuditSettings, step: int | None) -> None:
        self.settings, self.step = settings, step
        self.metrics: dict[str, float] = {}
        self.seconds = 0.0
        self._rows: list[torch.Tensor] = []
        self._engines: list[torch.Tensor] = []

    def add(self, rows: torch.Tensor | None, batch: TensorDictBase) -> None:
        """The loss's ``sampler_gap`` rows of ``batch`` (rows without an engine: engine 0)."""
        if rows is None:
            return
        tick = time.perf_counter()
        engines = batch.get(ENGINE_KEY, None)
        if engines is None:
            engines = torch.zeros(rows.shape[0], dtype=torch.long)
        self._rows.append(rows.detach().cpu())
        self._engines.append(engines.reshape(-1).long().cpu())
        self.seconds += time.perf_counter() - tick

    def check(self) -> None:
        """Reduce over the ranks (collectives: every rank calls it), set :attr:`metrics`, and
        raise :class:`AuditError` when an engine is over a threshold."""
        tick = time.perf_counter()
        gap = self.reduce()
        self.seconds += time.perf_counter() - tick
        self.metrics = {**gap.metrics(), "audit/trainer_seconds": self.seconds}
        gap.check(self.settings, self.step or 0, self.metrics)

    def reduce(self) -> LogProbGap:
        """Every rank's rows added up per engine (collectives: every rank calls it)."""
        rows = torch.cat(self._rows) if self._rows else torch.zeros(0, len(GAP_COLUMNS))
        engines = torch.cat(self._engines) if self._engines else torch.zeros(0, dtype=torch.long)
        local = torch.tensor([int(engines.max()) + 1 if len(engines) else 1])
        count = int(distributed.all_reduce_max_values(local))  # engines: the same on every rank
        sums = torch.zeros(count, 3, dtype=torch.float64)  # abs_sum, k3_sum, tokens
        sums.index_add_(0, engines, rows[:, [0, 2, 3]].double())
        largest = torch.zeros(count).scatter_reduce(0, engines, rows[:, 1], "amax")
        sums = distributed.all_reduce_sum(sums)
        largest = distributed.all_reduce_max_values(largest)
        tokens = sums[:, 2].clamp(min=1)
        return LogProbGap(
            mean=(sums[:, 0] / tokens).tolist(),
            max=largest.tolist(),
            kl=(sums[:, 1] / tokens).tolist(),
            tokens=[int(n) for n in sums[:, 2].tolist()],
        )


class StepAudit:
    """The driver's checks of a step: the token round trip and the weight checksums.

    Args:
        settings: the config's ``audit``.
        tokenizer: the policy's tokenizer (decodes and encodes the responses).
    """

    def __init__(self, settings: AuditSettings, tokenizer: Any) -> None:
        self.settings, self.tokenizer = settings, tokenizer

    def token_round_trip(self, batch: TensorDictBase, step: int) -> dict[str, float]:
        """``audit/token_roundtrip_mismatches`` (and ``_fraction``) of ``batch``'s responses;
        raises :class:`AuditError` over ``max_roundtrip_mismatch_fraction``."""
        tick = time.perf_counter()
        responses = [r.tolist() for r in batch["tokens"].as_list("response")]
        differ = round_trip_mismatches(self.tokenizer, responses)
        fraction = len(differ) / max(len(responses), 1)
        metrics = {
            "audit/token_roundtrip_mismatches": float(len(differ)),
            "audit/token_roundtrip_mismatch_fraction": fraction,
            "audit/driver_seconds": time.perf_counter() - tick,
        }
        bound = self.settings.max_roundtrip_mismatch_fraction
        if bound is not None and fraction > bound:
            engines = batch.get(ENGINE_KEY, None)
            engine = int(engines.reshape(-1)[differ[0]]) if engines is not None else None
            raise AuditError(
                f"consistency audit, step {step}: {len(differ)} of {len(responses)} sampled "
                f"responses ({fraction:.1%}) do not re-encode to their tokens (first: row "
                f"{differ[0]}{f', engine {engine}' if engine is not None else ''}; "
                f"audit.max_roundtrip_mismatch_fraction: {bound:g}); decoding and encoding "
                "again changes them, so text built from them is not what was sampled",
                step,
                engine,
                metrics,
            )
        return metrics

    def weight_checksums(self, sync: Any, step: int) -> dict[str, float]:
        """``audit/weight_checksum_mismatches`` of ``audit/weight_checksums_checked``: the
        engines whose checksum after the push (``sync.engine_checksums``) is not the trainer's
        (``sync.checksum``); raises :class:`AuditError` on one when
        ``stop_on_checksum_mismatch``. A push without checksums checks nothing."""
        sent = getattr(sync, "checksum", None)
        held = tuple(getattr(sync, "engine_checksums", None) or ()) if sent else ()
        wrong = [engine for engine, checksum in enumerate(held) if checksum != sent]
        metrics = {
            "audit/weight_checksum_mismatches": float(len(wrong)),
            "audit/weight_checksums_checked": float(len(held)),
        }
        if wrong and self.settings.stop_on_checksum_mismatch:
            engine = wrong[0]
            raise AuditError(
                f"consistency audit, step {step}: after pushing version "
                f"{getattr(sync, 'version', '?')}, engine {engine} holds weights with checksum "
                f"{held[engine]}, not the trainer's {sent} ({len(wrong)} of {len(held)} engines "
                "differ; audit.stop_on_checksum_mismatch); the next step would sample from "
                "other weights than the trainer's",
                step,
                engine,
                metrics,
            )
        return metrics


def round_trip_mismatches(tokenizer: Any, responses: list[list[int]]) -> list[int]:
    """The indices of ``responses`` (token ids) that ``tokenizer`` does not give back after
    decoding them (special tokens kept, no clean-up of spaces) and encoding the text (no
    special tokens added)."""
    texts = tokenizer.batch_decode(
        responses, skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    pairs = zip(responses, encoded, strict=True)
    return [row for row, (ids, again) in enumerate(pairs) if ids != again]


def _weighted(values: list[float], weights: list[int]) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total if total else 0.0
