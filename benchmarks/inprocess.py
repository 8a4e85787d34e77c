"""The GRPO iteration in one process, composed from llmrl's parts: for benchmarks only.

The GRPO stage runs on the distributed runtime (:class:`llmrl.runtime.GRPORuntime`: an inference
engine, env workers and trainer ranks as Ray actors). To time the algorithm itself, without Ray
and without a second copy of the model, the benchmarks compose the same parts in one process:
the trainer's model is loaded once and the sampler shares it (no weight copy, so the weight sync
is a version bump)::

    batch = next(collector)                  # TaskEnv + TransformersWrapper: prompts x G, rewards
    batch = advantage(batch)                 # MCAdvantage, group-relative
                                             # (both: DynamicSampler, as the runtime's step)
    metrics = trainer.train(batch, 1)        # GRPOTrainer: the per-rank loss, backward, AdamW
    collector.update_policy_weights_()       # InProcessWeightUpdater: version + 1

``benchmarks/runtime.py`` compares this with the runtime's step on the same workload (the
runtime's own cost); ``grpo_step.py``, ``overhead.py`` and ``learning.py`` time this step
against the peers.
"""

from __future__ import annotations

import math
import time
from typing import Any

from tensordict import TensorDictBase

from llmrl.collectors import DynamicSampler, InProcessWeightUpdater, LLMCollector
from llmrl.config.grpo import GRPOConfig
from llmrl.data.prepare import load_prepared
from llmrl.envs.task_env import TaskEnv
from llmrl.envs.tasks.prepared import prepared_task
from llmrl.models import load_model, load_tokenizer
from llmrl.objectives import build_advantage
from llmrl.policies import TransformersWrapper
from llmrl.runtime.grpo_runtime import rollout_metrics
from llmrl.train.grpo_trainer import GRPOTrainer
from llmrl.train.precision import TrainingPrecision
from llmrl.train.trainable_model import load_trainable_model


class InProcessGRPO:
    """Sampler, environment, advantage and the per-rank trainer of ``config`` in this process.

    Example:
        >>> grpo = InProcessGRPO(config)
        >>> batch, metrics = grpo.step()   # metrics: rewards, losses, per-phase seconds
    """

    def __init__(self, config: GRPOConfig) -> None:
        self.config = config
        task, _ = prepared_task(config.data.path)
        rows = load_prepared(config.data.path)[0][: config.data.max_train_rows]
        self.tokenizer = load_tokenizer(config.model.spec)
        # the trainer's model (float32 masters under mixed precision), as a rank builds it
        self.model = load_trainable_model(config.model, config.lora)
        self.precision = TrainingPrecision.of(config.model)
        # the sampler shares it, unless it samples in another dtype (mixed precision): then it
        # holds its own copy in model.dtype, as an engine does, and gets the cast weights
        sampling_model = self.model
        if self.precision.casts:
            sampling_model = load_model(
                config.model.spec, dtype=config.model.dtype, device=config.model.device
            )
        self.sampler = TransformersWrapper(
            sampling_model, self.tokenizer, generate_kwargs=config.generation.as_kwargs()
        )
        env = TaskEnv(
            task,
            rows,
            batch_size=config.prompts_per_step,
            repeats=config.num_samples,
            seed=config.seed,
        )
        turns = config.prompts_per_step * config.num_samples
        self.collector = LLMCollector(
            env,
            self.sampler,
            dialog_turns_per_batch=turns,
            weight_updater=InProcessWeightUpdater(self.sampler, source=self.model),
        )
        self.advantage = build_advantage(config)
        self.sampler = DynamicSampler(
            self.advantage, config.prompts_per_step, config.advantage.resample_rounds
        )
        # as the runtime's TrainerGroup: optimizer steps per update pass, and the schedule length
        self.minibatches = math.ceil(turns / (config.minibatch_size or turns))
        total_steps = config.steps * config.updates_per_step * self.minibatches
        self.trainer = GRPOTrainer(config, self.model, self.tokenizer, total_steps)
        self.skipped_steps = 0
        self.underfilled_steps = 0
        self._batches = iter(self.collector)

    def step(self, number: int | None = None) -> tuple[TensorDictBase, dict[str, Any]]:
        """One GRPO iteration; the batch and the metrics ``GRPORuntime.step`` reports (rollout
        statistics, dynamic sampling counts, losses, ``generation_seconds``, ``training_seconds``,
        ``loss_forward_seconds``, ``backward_seconds``, ``optimizer_seconds``,
        ``weight_sync_seconds``, ``policy_version``, ``tokens_per_second``...)."""
        tick = time.perf_counter()
        sampled = self.sampler.sample(lambda _round: next(self._batches))
        batch, trained = sampled.batch, sampled.trained
        timings = {"generation_seconds": time.perf_counter() - tick}
        metrics: dict[str, Any] = {**rollout_metrics(batch), **sampled.metrics}
        self.underfilled_steps += int(sampled.underfilled)
        trainer_version = self.collector.policy_version
        tick = time.perf_counter()
        if trained is not None and trained.batch_size[0] > 0:
            result = self.trainer.train(trained, self.minibatches, step=number)
            self.skipped_steps += int(result.pop("skipped_updates"))
            metrics.update(result)
        timings["training_seconds"] = time.perf_counter() - tick
        tick = time.perf_counter()
        weights = self.precision.export(self.model.state_dict()) if self.precision.casts else None
        self.collector.update_policy_weights_(weights)
        timings["weight_sync_seconds"] = time.perf_counter() - tick
        versions = batch["policy_version"].reshape(-1)
        metrics.update(
            timings,
            skipped_steps=self.skipped_steps,
            dropped_zero_std_groups=self.advantage.stats.get("dropped_zero_std_groups", 0),
            underfilled_steps=self.underfilled_steps,
            policy_version=self.collector.policy_version,
            staleness=trainer_version - int(versions.min()),
        )
        metrics.update(self.collector.metrics())
        metrics["tokens_per_second"] = metrics["response_tokens"] / max(
            timings["generation_seconds"], 1e-9
        )
        return batch, metrics
