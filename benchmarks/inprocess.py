"""The GRPO iteration in one process, composed from llmrl's parts: for benchmarks only.

The GRPO stage runs on the distributed runtime (:class:`llmrl.runtime.GRPORuntime`: an inference
engine, env workers and trainer ranks as Ray actors). To time the algorithm itself, without Ray
and without a second copy of the model, the benchmarks compose the same parts in one process:
the trainer's model is loaded once and the sampler shares it (no weight copy, so the weight sync
is a version bump). The step is the runtime's own, :func:`llmrl.runtime.grpo_step.grpo_step`,
over these parts::

    batch = next(collector)                  # collect(): TaskEnv + TransformersWrapper
    batch = advantage(batch)                 # the DynamicSampler: MCAdvantage, group-relative
    metrics = trainer.train(batch, 1)        # train(): GRPOTrainer, the per-rank loss, AdamW
    collector.update_policy_weights_()       # push_weights(): InProcessWeightUpdater, version + 1

``benchmarks/runtime.py`` compares this with the runtime's step on the same workload (the
runtime's own cost); ``grpo_step.py``, ``overhead.py`` and ``learning.py`` time this step
against the peers.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from tensordict import TensorDictBase

from llmrl.collectors import DynamicSampler, LLMCollector
from llmrl.config.grpo import GRPOConfig
from llmrl.data.prepare import load_prepared
from llmrl.envs.task_env import TaskEnv
from llmrl.envs.tasks.prepared import prepared_task
from llmrl.models import load_model, load_tokenizer
from llmrl.objectives import build_advantage
from llmrl.policies import TransformersWrapper
from llmrl.runtime.grpo_runtime import VERSION_HISTORY
from llmrl.runtime.grpo_step import COUNTERS, grpo_step
from llmrl.train.audit import StepAudit
from llmrl.train.grpo_trainer import GRPOTrainer
from llmrl.train.precision import TrainingPrecision
from llmrl.train.trainable_model import load_trainable_model
from llmrl.transports import InProcessWeightUpdater


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
        self._steps = 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.audit = StepAudit(config.audit, self.tokenizer) if config.audit.enabled else None
        self.trained_versions: deque[tuple[int, list[int]]] = deque(maxlen=VERSION_HISTORY)
        self._batches = iter(self.collector)

    def step(self, number: int | None = None) -> tuple[TensorDictBase, dict[str, Any]]:
        """One GRPO iteration: :func:`~llmrl.runtime.grpo_step.grpo_step` over these parts; the
        batch and the metrics ``GRPORuntime.step`` reports (rollout statistics, dynamic sampling
        counts, losses, ``generation_seconds``, ``training_seconds``, ``loss_forward_seconds``,
        ``backward_seconds``, ``optimizer_seconds``, ``weight_sync_seconds``,
        ``policy_version``, ``tokens_per_second``...)."""
        self._steps += 1
        return grpo_step(self, self._steps if number is None else number)

    # the parts grpo_step takes (StepParts)

    @property
    def policy_version(self) -> int:
        """The version the sampler holds (= optimizer steps taken)."""
        return self.collector.policy_version

    def collect(self, round_index: int) -> TensorDictBase:
        """The collector's next batch (every round alike: the sampler is in this process)."""
        return next(self._batches)

    def train(self, trained: TensorDictBase, number: int) -> dict[str, float]:
        """The per-rank trainer, on the whole batch."""
        return self.trainer.train(trained, self.minibatches, step=number)

    def push_weights(self) -> Any:
        """A version bump when the sampler shares the model; the cast weights otherwise."""
        weights = self.precision.export(self.model.state_dict()) if self.precision.casts else None
        return self.collector.update_policy_weights_(weights)

    def collector_metrics(self) -> dict[str, float]:
        """``collector/*``."""
        return self.collector.metrics()
