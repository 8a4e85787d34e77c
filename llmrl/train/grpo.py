"""The GRPO stage: sample groups, score them, learn from group-relative advantages.

    for step in range(start, steps):
        batch = next(rollouts)                  # prompts x G responses, rewards (collector)
        batch = advantage(batch)                # (r - mean_group) / std_group
        for update in range(updates_per_step):  # optimizer steps over the batch
            for minibatch in split(batch): loss(minibatch).backward(); clip; step
        rollouts.update_policy_weights_()       # the sampler now runs the new weights
        log, checkpoint

In ``sync`` mode the sampler and the trainer share one model (strictly on-policy). In ``async``
mode a background thread keeps sampling with its own copy of the weights while the trainer
learns; a batch sampled more than ``max_staleness`` versions ago is dropped and counted.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDictBase

from llmrl.collectors import InProcessWeightUpdater, LLMCollector
from llmrl.config.grpo import GRPOConfig
from llmrl.config.loading import ConfigError
from llmrl.data.non_tensor import as_list
from llmrl.data.prepare import load_prepared
from llmrl.envs.task_env import TaskEnv
from llmrl.envs.transforms import RetrieveLogProb
from llmrl.models import load_model, load_tokenizer
from llmrl.objectives import GRPOLoss, MCAdvantage
from llmrl.policies import TransformersWrapper
from llmrl.train.async_rollouts import AsyncRollouts
from llmrl.train.lora import apply_lora
from llmrl.train.optim import build_optimizer
from llmrl.train.stage import (
    open_checkpoints,
    prepared_task,
    seed_everything,
    stage_tracker,
    step_bar,
)

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


@dataclass
class GRPOResult:
    """Where the stage ended."""

    step: int
    final_checkpoint: str
    reward_mean: float
    accuracy: float
    skipped_steps: int
    stale_batches: int
    seconds: float


def run_grpo(config: GRPOConfig) -> GRPOResult:
    """Run the GRPO stage described by ``config``."""
    started = time.perf_counter()
    seed_everything(config.seed)
    task, manifest = prepared_task(config.data.path)
    train_rows, _ = load_prepared(config.data.path)
    train_rows = train_rows[: config.data.max_train_rows]
    if not train_rows:
        raise ConfigError([f"data.path: {config.data.path}: the train split is empty"])
    tokenizer = load_tokenizer(config.model.spec)
    model = load_model(config.model.spec, dtype=config.model.dtype, device=config.model.device)
    model = apply_lora(model, config.lora)
    model.eval()  # no dropout: sampling and training log-probs see the same network

    generation = config.generation.as_kwargs()
    transforms = []
    if config.reference:
        reference = load_model(
            config.model.spec, dtype=config.model.dtype, device=config.model.device
        )
        transforms.append(
            RetrieveLogProb(TransformersWrapper(reference.requires_grad_(False), tokenizer))
        )
    env = TaskEnv(
        task,
        train_rows,
        batch_size=config.prompts_per_step,
        repeats=config.num_samples,
        seed=config.seed,
        transforms=transforms,
    )
    turns = config.prompts_per_step * config.num_samples
    if config.mode == "sync":
        sampler = TransformersWrapper(model, tokenizer, generate_kwargs=generation)
        rollouts = LLMCollector(
            env,
            sampler,
            dialog_turns_per_batch=turns,
            weight_updater=InProcessWeightUpdater(sampler, source=model),
        )
    else:
        sampler_model = copy.deepcopy(model).requires_grad_(False)
        sampler = TransformersWrapper(sampler_model, tokenizer, generate_kwargs=generation)
        rollouts = AsyncRollouts(
            LLMCollector(
                env,
                sampler,
                dialog_turns_per_batch=turns,
                weight_updater=InProcessWeightUpdater(sampler),
            ),
            trainer_model=model,
        )
    actor = TransformersWrapper(
        model, tokenizer, generate=False, input_mode="tokens", pad_output=True
    )
    loss_fn = GRPOLoss(
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
    advantage = MCAdvantage(
        config.num_samples,
        scale=config.advantage.scale,
        drop_zero_std=config.advantage.drop_zero_std,
    )
    # optimize() takes updates_per_step passes of ceil(batch / minibatch) optimizer steps
    minibatches = math.ceil(turns / (config.minibatch_size or turns))
    optimizer, scheduler = build_optimizer(
        model, config.optimizer, config.steps * config.updates_per_step * minibatches
    )
    checkpoints, state = open_checkpoints(config.checkpoint, model, optimizer, scheduler)
    start = state.step if state else 0
    counters = {"skipped_steps": 0, "stale_batches": 0, "dropped_zero_std_groups": 0}
    reward_history: list[tuple[int, float]] = []
    if state:
        env.primer.load_state_dict(state.extra["primer"])
        rollouts.load_state_dict(state.extra["collector"])  # with the policy version
        if sampler.model is not model:  # async: its copy predates the checkpoint's weights
            sampler.model.load_state_dict(model.state_dict())
        counters.update(state.extra.get("counters", {}))
        advantage.stats["dropped_zero_std_groups"] = counters["dropped_zero_std_groups"]
        reward_history = [(int(s), float(r)) for s, r in state.extra.get("reward_history", [])]
        logger.info("resuming GRPO from step %d (%s)", start, checkpoints.latest())

    last = {"reward_mean": math.nan, "accuracy": math.nan}
    iterator = iter(rollouts)
    with (
        stage_tracker(
            "grpo", config, run_id=state.extra.get("mlflow_run_id") if state else None
        ) as tracker,
        _stopping(rollouts),
    ):
        tracker.log_params(
            {"dataset.digest": manifest.get("digest"), "train_prompts": len(train_rows)}
        )
        bar = step_bar("grpo", start, config.steps, config.progress)
        for step in bar:
            timings = {}
            tick = time.perf_counter()
            batch = next(iterator)
            timings["generation_seconds"] = time.perf_counter() - tick
            metrics = rollout_metrics(batch)
            version = rollouts.policy_version
            versions = batch.get("policy_version", None)
            stale = version - int(versions.min()) if versions is not None else 0
            if config.mode == "async" and stale > config.max_staleness:
                counters["stale_batches"] += 1
                logger.info("step %d: dropped a batch %d versions old", step, stale)
                trained = None
            else:
                trained = advantage(batch)
            tick = time.perf_counter()
            if trained is not None and trained.batch_size[0] > 0:
                metrics.update(
                    optimize(trained, loss_fn, model, optimizer, scheduler, config, counters)
                )
            timings["training_seconds"] = time.perf_counter() - tick
            tick = time.perf_counter()
            rollouts.update_policy_weights_()
            timings["weight_sync_seconds"] = time.perf_counter() - tick
            done = step + 1
            counters["dropped_zero_std_groups"] = advantage.stats.get("dropped_zero_std_groups", 0)
            metrics.update(
                timings, **counters, policy_version=rollouts.policy_version, staleness=stale
            )
            metrics["tokens_per_second"] = metrics["response_tokens"] / max(
                timings["generation_seconds"], 1e-9
            )
            tracker.log_metrics(metrics, step=done)
            reward_history.append((done, metrics["reward_mean"]))
            last.update(reward_mean=metrics["reward_mean"], accuracy=metrics["accuracy"])
            bar.set_postfix(
                reward=f"{metrics['reward_mean']:.3f}", loss=f"{metrics.get('loss', math.nan):.4f}"
            )
            if done % config.tracking.log_samples_every == 0 or done == start + 1:
                tracker.log_table(sample_rows(batch), name="samples", step=done)
            if done % config.checkpoint.every == 0 or done == config.steps:
                collector_state = rollouts.state_dict()
                path = checkpoints.save(
                    done,
                    model,
                    tokenizer,
                    optimizer,
                    scheduler,
                    extra={
                        "primer": collector_state.get("primer") or env.primer.state_dict(),
                        "collector": collector_state,
                        "counters": dict(counters),
                        "reward_history": reward_history,
                        "mlflow_run_id": tracker.run_id,
                    },
                    metrics={"reward_mean": metrics["reward_mean"]},
                )
                tracker.log_checkpoint(path, done)
        tracker.log_reward_curve({"reward_mean": reward_history})
        final = checkpoints.latest()
    return GRPOResult(
        step=config.steps,
        final_checkpoint=str(Path(final) / "model") if final else "",
        reward_mean=last["reward_mean"],
        accuracy=last["accuracy"],
        skipped_steps=counters["skipped_steps"],
        stale_batches=counters["stale_batches"],
        seconds=time.perf_counter() - started,
    )


@contextmanager
def _stopping(rollouts: LLMCollector | AsyncRollouts) -> Iterator[None]:
    """Stop an :class:`AsyncRollouts` thread when the loop ends, also on an error."""
    try:
        yield
    finally:
        if isinstance(rollouts, AsyncRollouts):
            rollouts.shutdown()


def optimize(
    batch: TensorDictBase,
    loss_fn: GRPOLoss,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    config: GRPOConfig,
    counters: dict[str, int],
) -> dict[str, float]:
    """``updates_per_step`` passes of minibatch optimizer steps; returns mean loss metrics."""
    size = batch.batch_size[0]
    minibatch = config.minibatch_size or size
    sums: dict[str, float] = {}
    count = 0
    for _ in range(config.updates_per_step):
        for first in range(0, size, minibatch):
            out = loss_fn(batch[first : first + minibatch])
            out.loss.backward()
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
            values = {
                name: float(getattr(out, name).detach())
                for name in LOSS_METRICS
                if getattr(out, name) is not None  # e.g. entropy when not computed
            }
            values.update(loss=loss, grad_norm=grad_norm, lr=lr)
            for name, value in values.items():
                sums[name] = sums.get(name, 0.0) + value
            count += 1
    return {name: total / count for name, total in sums.items()}


def rollout_metrics(batch: TensorDictBase) -> dict[str, float]:
    """Reward, accuracy and length statistics of a collected batch."""
    reward = batch["reward"].float()
    lengths = torch.tensor([len(r) for r in batch["tokens"].as_list("response")], dtype=torch.float)
    metrics = {
        "reward_mean": float(reward.mean()),
        "reward_std": float(reward.std()) if reward.numel() > 1 else 0.0,
        "response_length_mean": float(lengths.mean()),
        "response_tokens": float(lengths.sum()),
        "accuracy": _mean_or_nan(batch.get("correct", None)),
        "format_rate": _mean_or_nan(batch.get("formatted", None)),
    }
    return metrics


def _mean_or_nan(values: torch.Tensor | None) -> float:
    return float(values.float().mean()) if values is not None else math.nan


def sample_rows(batch: TensorDictBase, limit: int = 8) -> list[dict]:
    """A few (prompt, response, reward) rows for the MLflow samples table."""
    queries = batch.get("query", None)
    prompts = as_list(queries) if queries is not None else [""] * batch.batch_size[0]
    responses = [str(r) for r in as_list(batch["text"].response)]
    rewards = batch["reward"].tolist()
    return [
        {"prompt": str(p), "response": r, "reward": w}
        for p, r, w in list(zip(prompts, responses, rewards, strict=True))[:limit]
    ]
