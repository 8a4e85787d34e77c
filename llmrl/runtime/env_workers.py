"""What each env worker runs: its share of the task's prompts, as a :class:`TaskEnv`.

The driver ships a :class:`TaskEnvFactory` to every env worker actor
(:class:`~llmrl.collectors.EnvWorker`); worker ``i`` builds a
:class:`~llmrl.envs.task_env.TaskEnv` over rows ``i, i + n, i + 2n, ...`` of the train split
(disjoint shards), drawing ``prompts_per_worker`` prompts x ``num_samples`` responses per reset,
with group ids ``i, i + n, ...`` (unique across workers, as the advantage needs).
Rewards (and tools) run there, off the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmrl.envs.tasks.base import Task


@dataclass(frozen=True)
class TaskEnvFactory:
    """``factory(worker_index) -> TaskEnv`` over that worker's shard of ``rows`` (picklable)."""

    task: Task
    rows: list[Any]
    num_workers: int
    prompts_per_worker: int
    num_samples: int
    seed: int

    def __call__(self, worker_index: int) -> Any:
        from llmrl.envs.task_env import TaskEnv

        return TaskEnv(
            self.task,
            self.rows[worker_index :: self.num_workers],
            batch_size=self.prompts_per_worker,
            repeats=self.num_samples,
            seed=self.seed + worker_index,
            group_ids=(worker_index, self.num_workers),  # unique across workers
        )
