"""The SFT stage: supervised fine-tuning on the prepared dataset's worked solutions.

Each example is a chat (the task's instructions as system prompt, the problem, the target
answer) and the loss is the NLL of the assistant tokens (content and end-of-turn), or MinorSFT
against a frozen reference (``loss_function: minor_sft``), plus ``kl_to_ref_coeff`` times a KL
to it. With ``reference: true`` every micro-batch is first scored by the reference
(:class:`~llmrl.train.frozen_reference.FrozenReference`). The loop:

    for step in range(start, steps):
        for each micro-batch: loss(reference(batch)) / grad_accum -> backward
        clip, skip if not finite, optimizer + scheduler step
        log; every eval_every: eval loss; every checkpoint.every: save
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from llmrl.config.sft import SFTConfig
from llmrl.core.config_loading import ConfigError
from llmrl.core.seeding import seed_everything
from llmrl.data import ChatHistory, History
from llmrl.data.prepare import load_prepared
from llmrl.envs.tasks import Problem, Task
from llmrl.envs.tasks.prepared import prepared_task
from llmrl.models import load_tokenizer
from llmrl.objectives import SFTLoss, SFTLossOutput
from llmrl.policies import TransformersWrapper
from llmrl.stages.common import (
    log_prepared_data,
    open_checkpoints,
    register_final_model,
    stage_tracker,
    step_bar,
)
from llmrl.train.checkpoint import CheckpointPayload, latest_checkpoint
from llmrl.train.frozen_reference import FrozenReference
from llmrl.train.optim import build_optimizer
from llmrl.train.peak_memory import peak_memory_mb, reset_peak_memory
from llmrl.train.precision import TrainingPrecision
from llmrl.train.trainable_model import load_trainable_model

logger = logging.getLogger(__name__)


@dataclass
class SFTResult:
    """Where the stage ended."""

    step: int
    final_checkpoint: str
    train_loss: float
    eval_loss: float | None
    skipped_steps: int
    seconds: float


def chat_examples(problems: list[Problem], task: Task) -> list[list[dict]]:
    """SFT chats: system (the task's answer format), the prompt (the user's problem, or a chat
    prompt's turns: its assistant turns are trained on too), assistant (the target)."""
    usable = [p for p in problems if p.sft_target]
    if not usable:
        raise ConfigError(
            [
                "data.path: no problem has an sft_target: this dataset cannot be used for SFT "
                "(prepare it with a completion column, or messages ending in an assistant turn)"
            ]
        )
    system = {"role": "system", "content": task.instructions}
    return [
        [
            *([] if p.messages and p.messages[0]["role"] == "system" else [system]),
            *(p.messages or [{"role": "user", "content": p.prompt}]),
            {"role": "assistant", "content": p.sft_target},
        ]
        for p in usable
    ]


class ChatBatches:
    """Shuffled micro-batches of chats, a new order every epoch; resumable by position."""

    def __init__(self, chats: list[list[dict]], batch_size: int, seed: int) -> None:
        self.chats, self.batch_size, self.seed = chats, batch_size, seed
        self.epoch, self.position = 0, 0
        self._order = self._shuffled()

    def _shuffled(self) -> list[int]:
        order = list(range(len(self.chats)))
        random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        return order

    def __iter__(self) -> Iterator[TensorDict]:
        return self

    def __next__(self) -> TensorDict:
        picked = []
        while len(picked) < self.batch_size:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffled()
            picked.append(self.chats[self._order[self.position]])
            self.position += 1
        return as_batch(picked)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffled()


def as_batch(chats: list[list[dict]]) -> TensorDict:
    """A scoring batch: ``("history", "full")`` holds the chats."""
    history = History.from_chats(chats)
    return TensorDict(
        {"history": ChatHistory(full=history, batch_size=[len(chats)])}, batch_size=[len(chats)]
    )


def _fits(chats: list[list[dict]], tokenizer, max_length: int) -> list[list[dict]]:
    lengths = [
        len(ids)
        for ids in History.from_chats(chats).apply_chat_template(tokenizer).as_list("input_ids")
    ]
    kept = [chat for chat, length in zip(chats, lengths, strict=True) if length <= max_length]
    if len(kept) < len(chats):
        logger.warning(
            "dropped %d examples longer than %d tokens", len(chats) - len(kept), max_length
        )
    if not kept:
        raise ConfigError([f"max_length: every example is longer than {max_length} tokens"])
    return kept


def run_sft(config: SFTConfig) -> SFTResult:
    """Run the SFT stage described by ``config``."""
    started = time.perf_counter()
    seed_everything(config.seed)
    task, manifest = prepared_task(config.data.path)
    train_rows, eval_rows = load_prepared(config.data.path)
    tokenizer = load_tokenizer(config.model.spec, trust_remote_code=config.model.trust_remote_code)
    train = _fits(
        chat_examples(train_rows[: config.data.max_train_rows], task), tokenizer, config.max_length
    )
    evals = chat_examples(eval_rows[: config.data.max_eval_rows], task) if eval_rows else []
    parts = _build_parts(config, tokenizer, train)
    checkpoints, state = open_checkpoints(
        config.checkpoint, parts.model, parts.optimizer, parts.scheduler
    )
    folder = config.checkpoint.dir
    start = state.step if state else 0
    if state:
        parts.batches.load_state_dict(state.extra["batches"])
        logger.info("resuming SFT from step %d (%s)", start, latest_checkpoint(folder))
    run_id = state.extra.get("mlflow_run_id") if state else None

    skipped = state.extra.get("skipped_steps", 0) if state else 0
    train_loss, eval_loss = math.nan, None
    with stage_tracker("sft", config, run_id=run_id, checkpoint_dir=folder) as tracker:
        tracker.log_params({"dataset.digest": manifest.get("digest"), "train_examples": len(train)})
        log_prepared_data(tracker, config.data.path, manifest)  # eval rows: eval loss
        bar = step_bar("sft", start, config.steps, config.progress)
        for step in bar:
            step_started = time.perf_counter()
            reset_peak_memory(config.model.device)
            metrics = _train_step(parts, config)
            if metrics.pop("stepped"):
                train_loss = metrics["loss"]
            else:
                skipped += 1
                logger.warning("step %d: non-finite loss or gradient norm; skipped", step)
            done = step + 1
            metrics.update(
                skipped_steps=skipped,
                step_seconds=time.perf_counter() - step_started,
                peak_memory_mb=peak_memory_mb(config.model.device),
            )
            if evals and (done % config.eval_every == 0 or done == config.steps):
                eval_loss = _eval_loss(parts.score, evals, config)
                metrics["eval_loss"] = eval_loss
            tracker.log_metrics(metrics, step=done)
            bar.set_postfix(
                loss=f"{metrics['loss']:.3f}",
                eval=f"{eval_loss:.3f}" if eval_loss else "-",
                mem=f"{metrics['peak_memory_mb']:.0f}MB",
            )
            if done % config.checkpoint.every == 0 or done == config.steps:
                extra = {
                    "batches": parts.batches.state_dict(),
                    "skipped_steps": skipped,
                    "mlflow_run_id": tracker.run_id,
                }
                kept = eval_loss if eval_loss is not None else metrics["loss"]
                payload = parts.payload(done, extra, {"eval_loss": kept})
                tracker.log_checkpoint(checkpoints.save(payload), done)
        final = latest_checkpoint(folder)
        register_final_model(tracker, "sft", config, final)
    return SFTResult(
        step=config.steps,
        final_checkpoint=str(Path(final) / "model") if final else "",
        train_loss=train_loss,
        eval_loss=eval_loss,
        skipped_steps=skipped,
        seconds=time.perf_counter() - started,
    )


@dataclass
class _SFTParts:
    """What a step of the stage works with: the trained model, its loss, optimizer and data."""

    model: torch.nn.Module
    tokenizer: Any
    precision: TrainingPrecision
    score: SFTScorer
    optimizer: torch.optim.Optimizer
    scheduler: Any
    batches: ChatBatches

    def payload(
        self, step: int, extra: dict[str, Any], metrics: dict[str, float]
    ) -> CheckpointPayload:
        """The checkpoint after ``step``: weights (and float32 masters when mixed), optimizer,
        scheduler, the data position and the run's counters in ``extra``."""
        model_state, masters = self.precision.checkpoint_weights(self.model)
        return CheckpointPayload(
            step=step,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            extra=extra,
            metrics=metrics,
            model_state=model_state,
            master_weights=masters,
        )


def _build_parts(config: SFTConfig, tokenizer: Any, train: list[list[dict]]) -> _SFTParts:
    """The trained model (float32 masters under mixed precision), the loss over it (with the
    frozen reference when ``reference``), AdamW with its schedule, and the shuffled batches."""
    precision = TrainingPrecision.of(config.model)
    precision.warn_if_pure()
    model = load_trainable_model(config.model, config.lora)
    actor = TransformersWrapper(
        model,
        tokenizer,
        generate=False,
        pad_output=True,
        log_prob_chunk_size=config.model.log_prob_chunk_size,
        packing=config.model.packing,
    )
    loss_fn = SFTLoss(
        actor,
        loss_function=config.loss_function,
        beta=config.beta,
        normalize_by_seq_length=config.normalize_by_seq_length,
        kl_to_ref_coeff=config.kl_to_ref_coeff or None,
    )
    reference = (
        FrozenReference(
            model,
            tokenizer,
            config.model.spec,
            config.model.dtype,
            config.model.device,
            load_options=config.model.load_options,
            packing=config.model.packing,
        )
        if config.reference
        else None
    )
    optimizer, scheduler = build_optimizer(model, config.optimizer, config.steps)
    return _SFTParts(
        model=model,
        tokenizer=tokenizer,
        precision=precision,
        score=SFTScorer(loss_fn, reference, lambda: precision.autocast(model)),
        optimizer=optimizer,
        scheduler=scheduler,
        batches=ChatBatches(train, config.batch_size, config.seed),
    )


def _train_step(parts: _SFTParts, config: SFTConfig) -> dict[str, Any]:
    """One optimizer step over ``grad_accum`` micro-batches: the loss (and its parts), the
    gradient norm, the learning rate, and ``stepped`` (False: a non-finite loss or gradient
    norm, so the optimizer skipped this step; the scheduler moves on either way)."""
    total = 0.0
    loss_terms: dict[str, float] = {}
    for _ in range(config.grad_accum):
        out = parts.score(next(parts.batches))
        (out.loss / config.grad_accum).backward()
        total += float(out.loss.detach()) / config.grad_accum
        for name, value in loss_parts(out).items():
            loss_terms[name] = loss_terms.get(name, 0.0) + value / config.grad_accum
    grad_norm = torch.nn.utils.clip_grad_norm_(parts.model.parameters(), config.optimizer.grad_clip)
    metrics: dict[str, Any] = {
        "loss": total,
        **loss_terms,
        "grad_norm": float(grad_norm),
        "lr": parts.scheduler.get_last_lr()[0],
    }
    metrics["stepped"] = math.isfinite(total) and math.isfinite(float(grad_norm))
    if metrics["stepped"]:
        parts.optimizer.step()
    parts.optimizer.zero_grad(set_to_none=True)
    parts.scheduler.step()
    return metrics


class SFTScorer:
    """The stage's loss on a micro-batch: the reference's log-probs first, when there is one,
    both under ``autocast`` (the compute dtype of mixed precision; see
    :class:`~llmrl.train.precision.TrainingPrecision`)."""

    def __init__(
        self,
        loss_fn: SFTLoss,
        reference: FrozenReference | None,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self.loss_fn, self.reference, self.autocast = loss_fn, reference, autocast

    def __call__(self, batch: TensorDict) -> SFTLossOutput:
        """The :class:`SFTLossOutput` of ``batch``."""
        with self.autocast():
            if self.reference is not None:
                batch = self.reference(batch)
            return self.loss_fn(batch)


def loss_parts(out: SFTLossOutput) -> dict[str, float]:
    """The parts of a loss worth logging beside ``loss`` when it is more than the NLL (with a
    reference): the NLL (``nll``), ``loss_kl_to_ref``, ``kl_to_ref`` and MinorSFT's value
    (``minor_sft``)."""
    if out.kl_to_ref is None and out.minor_sft is None:
        return {}  # the loss is the NLL
    parts = {"nll": float(out.sft)}
    if out.kl_to_ref is not None:
        parts["loss_kl_to_ref"] = float(out.loss_kl_to_ref.detach())
        parts["kl_to_ref"] = float(out.kl_to_ref)
    if out.minor_sft is not None:
        parts["minor_sft"] = float(out.minor_sft)
    return parts


@torch.no_grad()
def _eval_loss(score: SFTScorer, evals: list[list[dict]], config: SFTConfig) -> float:
    losses = []
    for start in range(
        0, min(len(evals), config.eval_batches * config.batch_size), config.batch_size
    ):
        losses.append(float(score(as_batch(evals[start : start + config.batch_size])).loss))
    return sum(losses) / len(losses)
