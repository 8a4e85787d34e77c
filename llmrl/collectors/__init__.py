"""Collectors: run policies in envs and hand the trainer batches of finished trajectories.

Layer 3 (collectors, transports, per-rank training): imports layers 0-2.

- :class:`LLMCollector`: one env and one policy in this process;
- :class:`RayLLMCollector`: env workers and inference actors on Ray (the ``local`` extra), as
  many as its :class:`ActorLayout` says;
- :class:`AsyncRollouts`: any collector in a background thread, at most ``max_staleness``
  policy versions ahead of the trainer.

Weights reach the inference policies through a weight transport (:mod:`llmrl.transports`),
whose ``version`` is the policy version a collector reports.

Importing this package does not import Ray (or vLLM): they are imported when first used.
"""

from llmrl.collectors.async_rollouts import AsyncRollouts
from llmrl.collectors.dynamic_sampling import DynamicSampler, SampledStep
from llmrl.collectors.llm_collector import (
    BatchAssembler,
    CollectorBase,
    LLMCollector,
    StepResult,
    TrajectoryRunner,
)
from llmrl.collectors.ray_actors import EnvWorker, InferenceActor
from llmrl.collectors.ray_collector import RayLLMCollector
from llmrl.collectors.ray_layout import ActorLayout

__all__ = [
    "ActorLayout",
    "AsyncRollouts",
    "BatchAssembler",
    "CollectorBase",
    "DynamicSampler",
    "EnvWorker",
    "InferenceActor",
    "LLMCollector",
    "RayLLMCollector",
    "SampledStep",
    "StepResult",
    "TrajectoryRunner",
]
