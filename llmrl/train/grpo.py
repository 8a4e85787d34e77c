"""The GRPO stage: sample groups, score them, learn from group-relative advantages.

Each step is one :meth:`GRPOTrainer.step` (collect prompts x G responses with rewards,
group-relative advantages, loss, backward, optimizer, weight sync); the stage logs every step to
MLflow and writes checkpoints it can resume from.

In ``sync`` mode the sampler and the trainer share one model (strictly on-policy). In ``async``
mode a background thread keeps sampling with its own copy of the weights while the trainer
learns; a batch sampled more than ``max_staleness`` versions ago is dropped and counted.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tensordict import TensorDictBase

from llmrl.config.grpo import GRPOConfig
from llmrl.data.non_tensor import as_list
from llmrl.train.grpo_trainer import GRPOTrainer
from llmrl.train.stage import open_checkpoints, seed_everything, stage_tracker, step_bar

logger = logging.getLogger(__name__)


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
    trainer = GRPOTrainer(config)
    checkpoints, state = open_checkpoints(
        config.checkpoint, trainer.model, trainer.optimizer, trainer.scheduler
    )
    start = state.step if state else 0
    reward_history: list[tuple[int, float]] = []
    if state:
        trainer.load_state(state)
        reward_history = [(int(s), float(r)) for s, r in state.extra.get("reward_history", [])]
        logger.info("resuming GRPO from step %d (%s)", start, checkpoints.latest())

    last = {"reward_mean": math.nan, "accuracy": math.nan}
    with (
        stage_tracker(
            "grpo",
            config,
            run_id=state.extra.get("mlflow_run_id") if state else None,
            checkpoints=checkpoints,
        ) as tracker,
        _stopping(trainer),
    ):
        tracker.log_params(
            {
                "dataset.digest": trainer.manifest.get("digest"),
                "train_prompts": len(trainer.train_rows),
            }
        )
        bar = step_bar("grpo", start, config.steps, config.progress)
        for step in bar:
            done = step + 1
            batch, metrics = trainer.step(done)
            tracker.log_metrics(metrics, step=done)
            reward_history.append((done, metrics["reward_mean"]))
            last.update(reward_mean=metrics["reward_mean"], accuracy=metrics["accuracy"])
            bar.set_postfix(
                reward=f"{metrics['reward_mean']:.3f}", loss=f"{metrics.get('loss', math.nan):.4f}"
            )
            if done % config.tracking.log_samples_every == 0 or done == start + 1:
                tracker.log_table(sample_rows(batch), name="samples", step=done)
            if done % config.checkpoint.every == 0 or done == config.steps:
                path = checkpoints.save(
                    done,
                    trainer.model,
                    trainer.tokenizer,
                    trainer.optimizer,
                    trainer.scheduler,
                    extra={
                        **trainer.state_extra(),
                        "reward_history": reward_history,
                        "mlflow_run_id": tracker.run_id,
                    },
                    metrics={"reward_mean": metrics["reward_mean"]},
                )
                tracker.log_checkpoint(path, done)
        tracker.log_reward_curve({"reward_mean": reward_history})
        final = checkpoints.latest()
    counters = trainer.counters
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
def _stopping(trainer: GRPOTrainer) -> Iterator[None]:
    """Stop the trainer's background sampler (async mode) when the loop ends, also on an
    error."""
    try:
        yield
    finally:
        trainer.shutdown()


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
