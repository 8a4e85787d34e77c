"""The GRPO runtime: the stage's roles (inference engines, env workers, trainer ranks, the

Layer 4 (runtime): imports layers 0-3.
reference model) placed on Ray from the :class:`~llmrl.topology.Topology`, and the transports
between them (rollouts to the trainer, weights to the engines).

Importing this package imports neither Ray nor vLLM; building a :class:`GRPORuntime` does.
"""

from llmrl.runtime.grpo_runtime import GRPORuntime, describe, resolve_topology
from llmrl.runtime.trainer_group import TrainerGroup, TrainerRankDied, split_groups

__all__ = [
    "GRPORuntime",
    "TrainerGroup",
    "TrainerRankDied",
    "describe",
    "resolve_topology",
    "split_groups",
]
