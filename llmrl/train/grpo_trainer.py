"""The GRPO algorithm of one trainer rank: loss, backward, optimizer step.

:class:`GRPOTrainer` holds what one rank needs to learn from its share of a batch (the model,
possibly wrapped by DDP or sharded by FSDP, the :class:`~llmrl.objectives.GRPOLoss`, AdamW and
its schedule). Rollouts, advantages, weight sync and placement are the runtime's
(:mod:`llmrl.runtime`); a rank receives whole groups with their ``advantage`` already set::

    for update in range(updates_per_step):      # passes over the batch
        for minibatch in split(shard, n):        # the same n on every rank
            for micro in plan(minibatch, m):     # gradient accumulation, the same m everywhere
                out = loss(micro)
                (out.loss * out.normalizer).backward()   # the micro-batch's sum
            grads *= world_size / global normalizer      # this rank's part of the global mean
            clip; optimizer.step()

**Ranks agree with one process.** Each loss term is a mean over the batch (tokens,
sequences...), but a rank sees only its shard. Every minibatch's denominator
(:attr:`GRPOLossOutput.normalizer`) is summed over the ranks and micro-batches, and each rank
scales its summed gradients by ``world_size / global``: after DDP/FSDP average the gradients,
the update is the one a single process would make on the whole batch (``tests/runtime`` checks
it to float rounding). A rank whose minibatch or micro-batch is empty scores a stand-in row with
weight 0, so every rank runs the same collectives.

**Micro-batches** (``micro_batch_size`` rows, or ``max_tokens_per_micro_batch`` tokens) trade
nothing but a little matmul efficiency for memory: the activations kept for backward are those
of one micro-batch, not of the minibatch. By rows, their count ``m`` is the largest part any
rank got over ``micro_batch_size`` (rows: one per turn of a multi-turn episode); by tokens, the
rows are packed first-fit decreasing into micro-batches of at most the budget and ``m`` is the
most any rank needs (:mod:`llmrl.train.micro_batches`). The same ``m`` on every rank; DDP and
FSDP synchronise the gradients on the last micro-batch only.

**Precision.** With ``model.dtype: bfloat16`` the model holds float32 master weights and AdamW
state, and the loss forward runs under bfloat16 autocast (FSDP2: its mixed-precision policy);
see :mod:`llmrl.train.precision`. The backward runs outside autocast, as torch recommends.

**The consistency audit** (``audit``, :mod:`llmrl.train.audit`): every forward of the first
pass over the batch also measures how far the sampler's log-probs are from the trainer's
(the anchor's, when scored), per engine; before each of that pass's optimizer steps the ranks
reduce those numbers and all raise :class:`~llmrl.train.audit.AuditError` when one is over a
threshold, so no update uses that data.

**The ratio's anchor with truncated importance sampling.** With ``loss.tis_cap`` the PPO
ratio's anchor is the training model's log-probs of the batch before its first update (the
proximal policy; the TIS weight ``min(exp(anchor - sampling), tis_cap)`` corrects from the
sampler to it, in async mode too). When a batch gets one optimizer step the loss reads it off
its own forward; when it gets several (``updates_per_step > 1`` or minibatches), every
minibatch is scored once, before the first update, into ``anchor_log_probs``, which every
update on it reads: the ratio moves away from 1 as the weights do, and clipping bounds it.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl.config.grpo import GRPOConfig
from llmrl.core.faults import fault_point
from llmrl.objectives import build_grpo_loss
from llmrl.policies import TransformersWrapper
from llmrl.train import distributed
from llmrl.train.audit import LogProbGapTally
from llmrl.train.micro_batches import row_plan, sequence_lengths, take, token_plan
from llmrl.train.optim import build_optimizer
from llmrl.train.peak_memory import peak_memory_mb, reset_peak_memory
from llmrl.train.precision import TrainingPrecision

logger = logging.getLogger(__name__)

LOSS_METRICS = (
    "loss_objective",
    "loss_entropy",
    "loss_kl_to_ref",
    "loss_kl_to_inference",
    "clip_fraction",
    "kl_approx",
    "ESS",
    "entropy",
    "kl_to_ref",
    "mismatch_fraction",
    "distill_reverse_kl",
    "distill_teacher_logprob_mean",
    "distill_teacher_share",
)
"""Loss terms and diagnostics reported per step (normalizer-weighted means over the ranks)."""
ANCHOR_KEY = "anchor_log_probs"
"""Where :meth:`GRPOTrainer.train` writes the ratio's anchor (see the module docstring)."""


class GRPOTrainer:
    """Loss and optimizer of one trainer rank over ``model`` (already wrapped for the strategy).

    Args:
        config: the stage config (loss, optimizer, updates and minibatches).
        model: the module the loss calls: plain, DDP-wrapped or FSDP-sharded.
        tokenizer: the model's tokenizer.
        total_steps: optimizer steps of the whole run (for the learning-rate schedule).

    Example (``config`` a :class:`~llmrl.config.grpo.GRPOConfig`; ``shard``: whole groups of
    sampled rows with their ``advantage``, as :class:`~llmrl.runtime.grpo_loop.InProcessGRPO`
    builds them)::

        trainer = GRPOTrainer(config, model, tokenizer, total_steps=50)
        metrics = trainer.train(shard, minibatches=1, step=1)  # one AdamW step over the shard
    """

    def __init__(
        self, config: GRPOConfig, model: torch.nn.Module, tokenizer: Any, total_steps: int
    ) -> None:
        self.config = config
        self.model = model
        self.precision = TrainingPrecision.of(config.model)
        actor = TransformersWrapper(
            model,
            tokenizer,
            generate=False,
            input_mode="tokens",
            pad_output=True,
            log_prob_chunk_size=config.model.log_prob_chunk_size,
            packing=config.model.packing,
        )
        self.loss_fn = build_grpo_loss(actor, config)  # loss.variant's class
        self.optimizer, self.scheduler = build_optimizer(model, config.optimizer, total_steps)

    def train(
        self,
        shard: TensorDictBase,
        minibatches: int,
        step: int | None = None,
        stand_in_only: bool = False,
    ) -> dict[str, float]:
        """``updates_per_step`` passes of ``minibatches`` optimizer steps over this rank's
        ``shard``; returns loss metrics (global over the ranks), ``grad_norm``, ``lr``,
        ``skipped_updates`` (non-finite, not applied), the seconds spent in the loss forward,
        backward and optimizer, and ``peak_memory_mb`` (the largest of any rank:
        :mod:`llmrl.train.peak_memory`).

        ``stand_in_only``: the batch had fewer groups than ranks and ``shard`` is a copy of
        another rank's rows, trained on with weight 0 (this rank only joins the collectives).
        ``step`` (1-based) names the training step for :mod:`llmrl.core.faults`.
        """
        reset_peak_memory(self.config.model.device)
        sums: dict[str, float] = {}
        seconds = {"loss_forward_seconds": 0.0, "backward_seconds": 0.0, "optimizer_seconds": 0.0}
        stand_in = shard[:1]
        parts = [shard[:0]] * minibatches if stand_in_only else split_evenly(shard, minibatches)
        # what each update scores: its part, or the stand-in row (weight 0) when it is empty
        scored = [
            (stand_in if part.batch_size[0] == 0 else part, part.batch_size[0] == 0)
            for part in parts
        ]
        anchored = self.anchors_needed(minibatches)
        self.loss_fn.old_log_probs_key = ANCHOR_KEY if anchored else None
        if anchored:
            tick = time.perf_counter()
            scored = [(self._with_anchor(batch), empty) for batch, empty in scored]
            seconds["loss_forward_seconds"] += time.perf_counter() - tick
        plans = self.micro_plans([batch for batch, _ in scored])
        # the consistency audit of the first pass: each part's log-prob gap, before its
        # optimizer step (see llmrl.train.audit)
        audit = LogProbGapTally(self.config.audit, step) if self.config.audit.enabled else None
        for update in range(self.config.updates_per_step):
            for (batch, empty), plan in zip(scored, plans, strict=True):
                checked = audit if update == 0 else None
                values = self._update(batch, empty, plan, seconds, step, checked)
                for name, value in values.items():
                    sums[name] = sums.get(name, 0.0) + value
        count = self.config.updates_per_step * minibatches
        skipped = sums.pop("skipped", 0.0)
        means = {name: total / count for name, total in sums.items()}
        peak = distributed.all_reduce_max(round(peak_memory_mb(self.config.model.device)))
        return {
            **means,
            **seconds,
            **(audit.metrics if audit is not None else {}),
            "skipped_updates": skipped,
            "peak_memory_mb": float(peak),
        }

    def micro_batches(self, rows: int) -> int:
        """Forward/backward passes per optimizer step when this rank's largest part of a
        minibatch has ``rows`` rows: the largest part of any rank over ``micro_batch_size``
        (one collective), so every rank makes the same number; 1 without it."""
        size = self.config.micro_batch_size
        if size is None:
            return 1
        return max(1, math.ceil(distributed.all_reduce_max(rows) / size))

    def micro_plans(self, parts: list[TensorDictBase]) -> list[list[list[int]]]:
        """The rows of each micro-batch of each of this rank's ``parts`` (minibatches), every
        part in the same number of passes on every rank (one collective; trailing passes may be
        empty): by ``max_tokens_per_micro_batch`` (first-fit decreasing of the rows' tokens),
        by ``micro_batch_size`` (even runs of rows), or one pass (see
        :mod:`llmrl.train.micro_batches`)."""
        budget = self.config.max_tokens_per_micro_batch
        if budget is None:
            count = self.micro_batches(max(part.batch_size[0] for part in parts))
            return [row_plan(part.batch_size[0], count) for part in parts]
        plans = [token_plan(sequence_lengths(part), budget) for part in parts]
        count = distributed.all_reduce_max(max(len(plan) for plan in plans))
        return [plan + [[]] * (count - len(plan)) for plan in plans]

    def anchors_needed(self, minibatches: int) -> bool:
        """Whether :meth:`train` scores the ratio's anchor before the first update: with
        ``loss.tis_cap`` and more than one optimizer step per batch."""
        steps = self.config.updates_per_step * minibatches
        return self.config.loss.tis_cap is not None and steps > 1

    def _with_anchor(self, batch: TensorDictBase) -> TensorDictBase:
        """A shallow copy of ``batch`` with the current log-probs at :data:`ANCHOR_KEY`."""
        batch = batch.copy()
        with self.precision.autocast(self.model):
            batch.set(ANCHOR_KEY, self.loss_fn.anchor_log_probs(batch))
        return batch

    def _update(
        self,
        batch: TensorDictBase,
        empty: bool,
        plan: list[list[int]],
        seconds: dict[str, float],
        step: int | None,
        audit: LogProbGapTally | None = None,
    ) -> dict[str, float]:
        """One optimizer step on this rank's part of a minibatch, one forward and backward pass
        per micro-batch of ``plan`` (its rows; ``empty``: ``batch`` is the stand-in row, trained
        on with weight 0). With ``audit``, the log-prob gap of these forwards (of the batch's
        anchor when it has one) is added to the step's and checked before the optimizer step."""
        world = distributed.world_size()
        names: list[str] = []  # the diagnostics this config's loss computes
        weighted = torch.zeros(())  # normalizer, loss, diagnostics, each times the normalizer
        micros = [take(batch, rows) for rows in plan]
        for index, micro in enumerate(micros):
            stand_in = empty or micro.batch_size[0] == 0
            tick = time.perf_counter()
            with self.precision.autocast(self.model):  # bf16 compute over float32 masters
                out = self.loss_fn(batch[:1] if stand_in else micro)
            names = [name for name in LOSS_METRICS if getattr(out, name) is not None]
            local = 0.0 if stand_in else float(out.normalizer.detach())
            values = [float(out.loss.detach()), *(float(getattr(out, n).detach()) for n in names)]
            weighted = weighted + torch.tensor([1.0, *values]) * local
            if audit is not None and not stand_in:
                audit.add(out.sampler_gap, micro)
            seconds["loss_forward_seconds"] += time.perf_counter() - tick
            tick = time.perf_counter()
            with self._gradient_sync(last=index == len(micros) - 1):
                (out.loss * local).backward()  # the micro-batch's sum over its normalizer
            seconds["backward_seconds"] += time.perf_counter() - tick
        # one collective for the denominator and every weighted diagnostic
        tick = time.perf_counter()
        totals = distributed.all_reduce_sum(weighted)
        global_norm = float(totals[0])
        scale = world / global_norm if global_norm > 0 else 0.0
        for parameter in self.model.parameters():
            if parameter.grad is not None:
                parameter.grad.mul_(scale)
        seconds["backward_seconds"] += time.perf_counter() - tick
        if step is not None:
            fault_point("backward", step)
        if audit is not None:  # raises before the optimizer step uses a batch over a threshold
            audit.check()
        tick = time.perf_counter()
        means = (totals / global_norm).tolist() if global_norm > 0 else [0.0] * len(totals)
        loss = means[1]
        grad_norm = _as_float(
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optimizer.grad_clip)
        )
        lr = self.scheduler.get_last_lr()[0]  # the rate of this update, before the schedule moves
        finite = math.isfinite(loss) and math.isfinite(grad_norm)  # the same on every rank
        if finite:
            self.optimizer.step()
        else:
            logger.warning("non-finite loss or gradient norm; optimizer step skipped")
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        seconds["optimizer_seconds"] += time.perf_counter() - tick
        return {
            **dict(zip(names, means[2:], strict=True)),
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "skipped": 0.0 if finite else 1.0,
        }

    def _gradient_sync(self, last: bool) -> AbstractContextManager[Any]:
        """DDP and FSDP all-reduce the gradients on the last micro-batch's backward only."""
        no_sync = getattr(self.model, "no_sync", None)  # DistributedDataParallel
        if callable(no_sync) and not last:
            return no_sync()
        set_sync = getattr(self.model, "set_requires_gradient_sync", None)  # FSDP2
        if callable(set_sync):
            set_sync(last)
        return nullcontext()


def split_evenly(batch: TensorDictBase, parts: int) -> list[TensorDictBase]:
    """``batch`` cut into ``parts`` contiguous slices whose sizes differ by at most one (some
    empty when ``parts`` exceeds the rows)."""
    return [take(batch, rows) for rows in row_plan(batch.batch_size[0], parts)]


def _as_float(value: torch.Tensor) -> float:
    """A scalar tensor (an FSDP DTensor included) as a Python float."""
    full = getattr(value, "full_tensor", None)
    return float(full() if callable(full) else value)
