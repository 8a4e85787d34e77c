"""One GRPO iteration, without the stage's tracking and checkpoints.

:class:`GRPOTrainer` builds what a GRPO step needs from a :class:`GRPOConfig` (model, sampler,
task environment, collector, advantage, loss, optimizer) and runs one step at a time::

    batch = next(rollouts)                  # prompts x G responses, rewards (collector)
    batch = advantage(batch)                # (r - mean_group) / std_group
    for update in range(updates_per_step):  # optimizer steps over the batch
        for minibatch in split(batch): loss(minibatch).backward(); clip; step
    rollouts.update_policy_weights_()       # the sampler now runs the new weights

The stage (:func:`llmrl.train.grpo.run_grpo`) adds MLflow logging and checkpoints around it; the
benchmarks time exactly this step.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl.collectors import InProcessWeightUpdater, LLMCollector
from llmrl.config.grpo import GRPOConfig
from llmrl.config.loading import ConfigError
from llmrl.data.prepare import load_prepared
from llmrl.envs.task_env import TaskEnv
from llmrl.envs.transforms import RetrieveLogProb
from llmrl.models import load_model, load_tokenizer
from llmrl.objectives import GRPOLoss, MCAdvantage
from llmrl.policies import TransformersWrapper
from llmrl.train.async_rollouts import AsyncRollouts
from llmrl.train.checkpoint import TrainState
from llmrl.train.faults import fault_point
from llmrl.train.lora import apply_lora
from llmrl.train.optim import build_optimizer
from llmrl.train.stage import prepared_task

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
)


class GRPOTrainer:
    """The model, sampler, environment, loss and optimizer of a GRPO run, and its step.

    Example:
        >>> trainer = GRPOTrainer(config)
        >>> batch, metrics = trainer.step()   # one iteration; metrics include timings
    """

    def __init__(self, config: GRPOConfig) -> None:
        self.config = config
        self.task, self.manifest = prepared_task(config.data.path)
        train_rows, _ = load_prepared(config.data.path)
        self.train_rows = train_rows[: config.data.max_train_rows]
        if not self.train_rows:
            raise ConfigError([f"data.path: {config.data.path}: the train split is empty"])
        self.tokenizer = load_tokenizer(config.model.spec)
        model = load_model(config.model.spec, dtype=config.model.dtype, device=config.model.device)
        self.model = apply_lora(model, config.lora)
        self.model.eval()  # no dropout: sampling and training log-probs see the same network
        self.env = TaskEnv(
            self.task,
            self.train_rows,
            batch_size=config.prompts_per_step,
            repeats=config.num_samples,
            seed=config.seed,
            transforms=self._reference_transforms(),
        )
        self.sampler, self.rollouts = self._rollouts()
        actor = TransformersWrapper(
            self.model, self.tokenizer, generate=False, input_mode="tokens", pad_output=True
        )
        self.loss_fn = GRPOLoss(
            actor,
            clip_epsilon=config.loss.clip_epsilon,
            kl_to_ref_coeff=config.loss.kl_to_ref_coeff,
            kl_to_inference_coeff=config.loss.kl_to_inference_coeff,
            entropy_coeff=config.loss.entropy_coeff,
            aggregation=config.loss.aggregation,
            max_length_norm=(
                config.generation.max_new_tokens if config.loss.aggregation == "sum_norm" else None
            ),
            masking_strategy=config.loss.masking_strategy,
            tis_cap=config.loss.tis_cap,
        )
        self.advantage = MCAdvantage(
            config.num_samples,
            scale=config.advantage.scale,
            drop_zero_std=config.advantage.drop_zero_std,
        )
        # optimize() takes updates_per_step passes of ceil(batch / minibatch) optimizer steps
        turns = config.prompts_per_step * config.num_samples
        minibatches = math.ceil(turns / (config.minibatch_size or turns))
        self.optimizer, self.scheduler = build_optimizer(
            self.model, config.optimizer, config.steps * config.updates_per_step * minibatches
        )
        self.counters = {"skipped_steps": 0, "stale_batches": 0, "dropped_zero_std_groups": 0}
        self._iterator: Iterator[TensorDictBase] | None = None  # started by the first step

    def _reference_transforms(self) -> list:
        """A frozen copy of the starting model scoring each response (KL to reference)."""
        config = self.config
        if not config.reference:
            return []
        reference = load_model(
            config.model.spec, dtype=config.model.dtype, device=config.model.device
        )
        return [
            RetrieveLogProb(TransformersWrapper(reference.requires_grad_(False), self.tokenizer))
        ]

    def _rollouts(self) -> tuple[TransformersWrapper, LLMCollector | AsyncRollouts]:
        """The sampler and its collector: sharing the trained model (sync) or sampling from a
        copy in a background thread (async)."""
        config = self.config
        turns = config.prompts_per_step * config.num_samples
        generation = config.generation.as_kwargs()
        if config.mode == "sync":
            sampler = TransformersWrapper(self.model, self.tokenizer, generate_kwargs=generation)
            updater = InProcessWeightUpdater(sampler, source=self.model)
            collector = LLMCollector(
                self.env, sampler, dialog_turns_per_batch=turns, weight_updater=updater
            )
            return sampler, collector
        sampler_model = copy.deepcopy(self.model).requires_grad_(False)
        sampler = TransformersWrapper(sampler_model, self.tokenizer, generate_kwargs=generation)
        collector = LLMCollector(
            self.env,
            sampler,
            dialog_turns_per_batch=turns,
            weight_updater=InProcessWeightUpdater(sampler),
        )
        return sampler, AsyncRollouts(collector, trainer_model=self.model)

    def load_state(self, state: TrainState) -> None:
        """Continue from a checkpoint's extra state (the weights are already loaded)."""
        self.env.primer.load_state_dict(state.extra["primer"])
        self.rollouts.load_state_dict(state.extra["collector"])  # with the policy version
        if self.sampler.model is not self.model:  # async: its copy predates the checkpoint
            self.sampler.model.load_state_dict(self.model.state_dict())
        self.counters.update(state.extra.get("counters", {}))
        self.advantage.stats["dropped_zero_std_groups"] = self.counters["dropped_zero_std_groups"]

    def state_extra(self) -> dict[str, Any]:
        """What a checkpoint must hold besides weights and optimizer to resume this trainer."""
        collector_state = self.rollouts.state_dict()
        return {
            "primer": collector_state.get("primer") or self.env.primer.state_dict(),
            "collector": collector_state,
            "counters": dict(self.counters),
        }

    def step(self, number: int | None = None) -> tuple[TensorDictBase, dict[str, float]]:
        """One GRPO iteration; returns the collected batch and the step's metrics (rewards,
        losses, counters, and where the time went: ``generation_seconds``,
        ``loss_forward_seconds``, ``backward_seconds``, ``optimizer_seconds``,
        ``weight_sync_seconds``). ``number`` (1-based) names the step for
        :mod:`llmrl.train.faults`."""
        config, counters = self.config, self.counters
        if self._iterator is None:
            self._iterator = iter(self.rollouts)
        if number is not None:
            fault_point("generate", number)
        tick = time.perf_counter()
        batch = next(self._iterator)
        timings = {"generation_seconds": time.perf_counter() - tick}
        metrics = rollout_metrics(batch)
        version = self.rollouts.policy_version
        versions = batch.get("policy_version", None)
        stale = version - int(versions.min()) if versions is not None else 0
        if config.mode == "async" and stale > config.max_staleness:
            counters["stale_batches"] += 1
            logger.info("dropped a batch %d versions old", stale)
            trained = None
        else:
            trained = self.advantage(batch)
        tick = time.perf_counter()
        if trained is not None and trained.batch_size[0] > 0:
            metrics.update(
                optimize(
                    trained,
                    self.loss_fn,
                    self.model,
                    self.optimizer,
                    self.scheduler,
                    config,
                    counters,
                    step=number,
                )
            )
        timings["training_seconds"] = time.perf_counter() - tick
        tick = time.perf_counter()
        self.rollouts.update_policy_weights_()
        timings["weight_sync_seconds"] = time.perf_counter() - tick
        counters["dropped_zero_std_groups"] = self.advantage.stats.get("dropped_zero_std_groups", 0)
        metrics.update(
            timings, **counters, policy_version=self.rollouts.policy_version, staleness=stale
        )
        metrics.update(self.rollouts.metrics())  # collector/*: turns, batches, actor restarts
        metrics["tokens_per_second"] = metrics["response_tokens"] / max(
            timings["generation_seconds"], 1e-9
        )
        return batch, metrics

    def shutdown(self) -> None:
        """Stop the background sampler of async mode (a no-op in sync mode)."""
        if isinstance(self.rollouts, AsyncRollouts):
            self.rollouts.shutdown()


def optimize(
    batch: TensorDictBase,
    loss_fn: GRPOLoss,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    config: GRPOConfig,
    counters: dict[str, int],
    step: int | None = None,
) -> dict[str, float]:
    """``updates_per_step`` passes of minibatch optimizer steps; returns mean loss metrics and
    the seconds spent in the loss forward, backward and optimizer (summed over updates).
    ``step`` (1-based) names the training step for :mod:`llmrl.train.faults`."""
    size = batch.batch_size[0]
    minibatch = config.minibatch_size or size
    sums: dict[str, float] = {}
    seconds = {"loss_forward_seconds": 0.0, "backward_seconds": 0.0, "optimizer_seconds": 0.0}
    count = 0
    for _ in range(config.updates_per_step):
        for first in range(0, size, minibatch):
            tick = time.perf_counter()
            out = loss_fn(batch[first : first + minibatch])
            seconds["loss_forward_seconds"] += time.perf_counter() - tick
            tick = time.perf_counter()
            out.loss.backward()
            seconds["backward_seconds"] += time.perf_counter() - tick
            if step is not None:
                fault_point("backward", step)
            tick = time.perf_counter()
            loss = float(out.loss.detach())
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.optimizer.grad_clip)
            )
            lr = scheduler.get_last_lr()[0]  # the rate of this update, before the schedule moves
            if math.isfinite(loss) and math.isfinite(grad_norm):
                optimizer.step()
            else:
                counters["skipped_steps"] += 1
                logger.warning("non-finite loss or gradient norm; optimizer step skipped")
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            seconds["optimizer_seconds"] += time.perf_counter() - tick
            values = {
                name: float(getattr(out, name).detach())
                for name in LOSS_METRICS
                if getattr(out, name) is not None  # e.g. entropy when not computed
            }
            values.update(loss=loss, grad_norm=grad_norm, lr=lr)
            for name, value in values.items():
                sums[name] = sums.get(name, 0.0) + value
            count += 1
    return {**{name: total / count for name, total in sums.items()}, **seconds}


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
    }


def _mean_or_nan(values: torch.Tensor | None) -> float:
    return float(values.float().mean()) if values is not None else math.nan
