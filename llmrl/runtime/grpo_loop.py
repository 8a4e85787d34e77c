"""GRPO in one process: the stage's parts without Ray, and the loop a researcher's script runs.

The GRPO stage runs on :class:`~llmrl.runtime.GRPORuntime` (inference engines, env workers and
trainer ranks as Ray actors). :class:`InProcessGRPO` builds the same parts in this process: the
trainer's model is loaded once and the sampler shares it, so a weight sync is a version bump.
Its step is the runtime's own, :func:`~llmrl.runtime.grpo_step.grpo_step`, so what a script
trains here is what the stage trains, step for step::

    sampled = sampler.sample(collect)   # prompts x G answers, rewards, group advantages
    metrics = trainer.train(trained)    # loss forward, backward, one AdamW step
    push_weights()                      # the sampler now holds the trained weights

:func:`train_grpo` is the loop around it. ``docs/grpo-loop.md`` shows a script that trains on
the arithmetic task with both; ``benchmarks/inprocess.py`` (the benchmarks' one-process
contender) and ``benchmarks/learning_search.py`` (the learning search) use them too. What each
phase costs on the project's machine: ``docs/measurements.md``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase

from llmrl.collectors import LLMCollector
from llmrl.config.grpo import GRPOConfig
from llmrl.data.prepare import load_prepared
from llmrl.envs.task_env import TaskEnv
from llmrl.envs.tasks.prepared import prepared_task
from llmrl.models import load_model, load_tokenizer
from llmrl.policies import TransformersWrapper
from llmrl.runtime.driver_parts import build_driver_parts
from llmrl.runtime.grpo_runtime import VERSION_HISTORY
from llmrl.runtime.grpo_step import COUNTERS, grpo_step
from llmrl.train.grpo_trainer import GRPOTrainer
from llmrl.train.precision import TrainingPrecision
from llmrl.train.trainable_model import load_trainable_model
from llmrl.transports import InProcessWeightUpdater

OnStep = Callable[[int, dict[str, float]], bool | None]
"""Called after each step with its number and metrics; a true result stops the loop."""


def _refuse_model_roles(config: GRPOConfig) -> None:
    """A config using a teacher, a judge or a reward model needs their servers, which only the
    runtime starts: refused here rather than trained without its signal."""
    used = [f"rewards.{name}" for name in config.rewards.models()]
    if config.loss.distillation is not None:
        used.append("loss.distillation")
    if used:
        raise ValueError(
            f"{', '.join(used)}: the model roles run as servers of the GRPO runtime "
            "(GRPORuntime, `llmrl grpo`); InProcessGRPO runs no model but the policy; use the "
            "runtime, or remove them"
        )


class InProcessGRPO:
    """Sampler, environment, advantage and trainer of ``config``, in this process.

    Example (``docs/grpo-loop.md`` runs a whole script)::

        grpo = InProcessGRPO(config)
        batch, metrics = grpo.step(1)   # metrics: rewards, losses, per-phase seconds
    """

    def __init__(self, config: GRPOConfig) -> None:
        _refuse_model_roles(config)
        self.config = config
        task, _ = prepared_task(config.data.path)
        rows = load_prepared(config.data.path)[0][: config.data.max_train_rows]
        self.tokenizer = load_tokenizer(config.model.spec)
        # The trained model, float32 masters under mixed precision: with AdamW's two moments and
        # the gradients, 16 bytes a parameter (LoRA: the base weights plus the adapters' 16).
        self.model = load_trainable_model(config.model, config.lora)
        self.precision = TrainingPrecision.of(config.model)
        # The sampler shares it, unless it samples in another dtype (mixed precision): then it
        # holds its own copy in model.dtype, as an engine does, and gets the cast weights.
        sampling_model = self.model
        if self.precision.casts:
            sampling_model = load_model(
                config.model.spec, dtype=config.model.dtype, device=config.model.device
            )
        policy = TransformersWrapper(
            sampling_model, self.tokenizer, generate_kwargs=config.generation.as_kwargs()
        )
        env = TaskEnv(
            task,
            rows,
            batch_size=config.prompts_per_step,
            repeats=config.num_samples,
            seed=config.seed,
            reward_weight=config.rewards.task_weight,
            fallback_reward=config.rewards.task_fallback_reward,
            timeout_s=config.rewards.task_timeout_s,
        )
        turns = config.turns_per_step
        self.collector = LLMCollector(
            env,
            policy,
            dialog_turns_per_batch=turns,
            weight_updater=InProcessWeightUpdater(policy, source=self.model),
        )
        parts = build_driver_parts(config, tokenizer=self.tokenizer)
        self.advantage, self.sampler = parts.advantage, parts.sampler
        self.shaping, self.audit = parts.shaping, parts.audit
        self.minibatches = config.minibatches
        self.trainer = GRPOTrainer(config, self.model, self.tokenizer, config.total_optimizer_steps)
        self._steps = 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.trained_versions: deque[tuple[int, list[int]]] = deque(maxlen=VERSION_HISTORY)
        self._batches = iter(self.collector)

    def step(self, number: int | None = None) -> tuple[TensorDictBase, dict[str, Any]]:
        """One GRPO iteration (:func:`~llmrl.runtime.grpo_step.grpo_step` over these parts):
        the batch and the metrics ``GRPORuntime.step`` reports (rollout statistics, dynamic
        sampling counts, losses, ``generation_seconds``, ``training_seconds``,
        ``weight_sync_seconds``, ``policy_version``, ``tokens_per_second``...)."""
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


def train_grpo(grpo: InProcessGRPO, steps: int, on_step: OnStep | None = None) -> dict[str, float]:
    """Steps 1 to ``steps`` of ``grpo``; after each, ``on_step(number, metrics)`` (log, evaluate,
    save; a true result stops the loop). Returns the last step's metrics, with
    ``step_seconds`` (the step's wall time, without ``on_step``'s) added to each step's."""
    metrics: dict[str, float] = {}
    for number in range(1, steps + 1):
        tick = time.perf_counter()
        # sampling: one forward per new token over every live row (most of a CPU step); training:
        # a forward and a backward over prompts + answers of the groups with a signal (the
        # backward about twice the forward); the push: nothing here unless the sampler casts.
        _, metrics = grpo.step(number)
        metrics["step_seconds"] = time.perf_counter() - tick
        if on_step is not None and on_step(number, metrics):
            break
    return metrics
