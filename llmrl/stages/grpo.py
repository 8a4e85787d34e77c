"""The GRPO stage: sample groups, score them, learn from group-relative advantages.

The stage runs the GRPO runtime (:mod:`llmrl.runtime`): inference engines, env workers and
trainer ranks placed on Ray from the topology. Each step is one :meth:`GRPORuntime.step`; the
stage (this process, the driver) adds what belongs to it alone: the MLflow run (written once per
step, by this process only), the progress bar, and when to checkpoint (rank 0 writes).

A step the consistency audit stops (:class:`~llmrl.train.audit.AuditError`: the sampler and the
trainer disagree beyond a threshold of ``audit``) ends the stage with that error: its
``audit/*`` metrics are logged at that step, one log line says why, and the MLflow run is
marked FAILED.

Resuming: the newest complete checkpoint gives every rank its weights and optimizer state and
the collector its dataset positions and policy version; the MLflow run recorded beside the
checkpoints is continued, from the step after the checkpoint.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from tensordict import TensorDictBase

from llmrl.config.grpo import GRPOConfig
from llmrl.core.seeding import seed_everything
from llmrl.data.non_tensor import as_list
from llmrl.runtime import GRPORuntime, resolve_topology
from llmrl.runtime.ray_cluster import actor_runtime_env, ray_session
from llmrl.stages.common import (
    log_prepared_data,
    register_final_model,
    stage_tracker,
    step_bar,
)
from llmrl.train.audit import AuditError
from llmrl.train.checkpoint import latest_checkpoint, read_train_state

logger = logging.getLogger(__name__)


@dataclass
class GRPOResult:
    """Where the stage ended."""

    step: int
    final_checkpoint: str
    reward_mean: float
    accuracy: float
    skipped_steps: int
    seconds: float


def run_grpo(config: GRPOConfig) -> GRPOResult:
    """Run the GRPO stage described by ``config``."""
    started = time.perf_counter()
    seed_everything(config.seed)
    folder = config.checkpoint.dir  # as configured: rank 0 writes it, this process only reads
    config = with_absolute_paths(config)  # actors may not share this process's directory
    topology = resolve_topology(config)
    latest = latest_checkpoint(folder) if config.checkpoint.resume == "auto" else None
    state = None
    if latest is not None:
        state = read_train_state(latest)
        logger.info("resuming GRPO from step %d (%s)", state.step, latest)
    else:
        logger.info("starting from scratch")
    start = state.step if state else 0
    reward_history = [
        (int(s), float(r)) for s, r in (state.extra if state else {}).get("reward_history", [])
    ]
    last = {"reward_mean": math.nan, "accuracy": math.nan}
    with ray_session(config.runtime.ray_address):
        runtime = GRPORuntime(
            config=config,
            topology=topology,
            resume_from=str(latest.resolve()) if latest is not None else None,
            resume_state=state.extra if state else None,
            runtime_env=actor_runtime_env(),
        )
        try:
            with stage_tracker(
                "grpo",
                config,
                run_id=state.extra.get("mlflow_run_id") if state else None,
                checkpoint_dir=folder,
            ) as tracker:
                tracker.log_params(
                    {
                        "dataset.digest": runtime.manifest.get("digest"),
                        "train_prompts": len(runtime.train_rows),
                        **runtime.runtime_params(),
                    }
                )
                log_prepared_data(tracker, config.data.path, runtime.manifest, ("train",))
                bar = step_bar("grpo", start, config.steps, config.progress)
                for step in bar:
                    done = step + 1
                    try:
                        batch, metrics = runtime.step(done)
                    except AuditError as error:  # the run is FAILED with the numbers that failed
                        tracker.log_metrics(error.metrics, step=error.step)
                        logger.error("GRPO stopped by the consistency audit: %s", error)
                        raise
                    tracker.log_metrics(metrics, step=done)
                    reward_history.append((done, metrics["reward_mean"]))
                    last.update(reward_mean=metrics["reward_mean"], accuracy=metrics["accuracy"])
                    bar.set_postfix(step_postfix(metrics))
                    if done % config.tracking.log_samples_every == 0 or done == start + 1:
                        tracker.log_table(sample_rows(batch), name="samples", step=done)
                    if done % config.checkpoint.every == 0 or done == config.steps:
                        path = runtime.save(
                            done,
                            extra={
                                "reward_history": reward_history,
                                "mlflow_run_id": tracker.run_id,
                            },
                            metrics={"reward_mean": metrics["reward_mean"]},
                        )
                        tracker.log_checkpoint(Path(path), done)
                tracker.log_reward_curve({"reward_mean": reward_history})
                register_final_model(tracker, "grpo", config, latest_checkpoint(folder))
        finally:
            runtime.shutdown()
    final = latest_checkpoint(folder)
    return GRPOResult(
        step=config.steps,
        final_checkpoint=str(Path(final) / "model") if final else "",
        reward_mean=last["reward_mean"],
        accuracy=last["accuracy"],
        skipped_steps=runtime.counters["skipped_steps"],
        seconds=time.perf_counter() - started,
    )


def with_absolute_paths(config: GRPOConfig) -> GRPOConfig:
    """``config`` with its checkpoint directory and a local model directory made absolute (the
    data is read here, in the driver)."""
    model = config.model
    local = {
        name: str(Path(value).resolve())
        for name, value in (("name", model.name), ("checkpoint", model.checkpoint))
        if value and Path(value).exists()
    }
    return config.model_copy(
        update={
            "checkpoint": config.checkpoint.model_copy(
                update={"dir": str(Path(config.checkpoint.dir).resolve())}
            ),
            "model": model.model_copy(update=local),
        }
    )


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


def step_postfix(metrics: dict[str, float]) -> dict[str, str]:
    """What a GRPO step's log line shows: reward, loss, policy version and peak memory. A step
    whose groups all lack a reward signal trains nothing (drop-only dynamic sampling): it has no
    loss or memory figure, and says so instead of printing nan."""
    trained = "loss" in metrics
    memory = metrics.get("peak_memory_mb")
    return {
        "reward": f"{metrics['reward_mean']:.3f}",
        "loss": f"{metrics['loss']:.4f}" if trained else "none (no group to train)",
        "version": str(int(metrics["policy_version"])),
        "mem": f"{memory:.0f}MB" if memory is not None else "-",
    }
