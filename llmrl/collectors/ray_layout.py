"""`ActorLayout`: a :class:`~llmrl.collectors.RayLLMCollector`'s actors and where each runs.

The one way to size the collector's actors: one mapping of Ray options per inference actor and
per env worker (resources, and a ``scheduling_strategy`` onto a placement group's bundle when
the actors run on a placed topology). :meth:`ActorLayout.uniform` gives every actor the same
fractional resources and no placement (two env workers and one inference actor fit a 2-CPU
machine); the GRPO runtime builds one from its placement's role specs
(:mod:`llmrl.topology.roles`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ActorLayout:
    """The Ray options of each inference actor (``inference[i]``) and env worker
    (``env_workers[j]``); env worker ``j`` sends its policy calls to inference actor
    ``j % len(inference)``. A rebuilt actor gets its slot's options again.

    Example::

        ActorLayout.uniform(env_workers=4, inference_actors=2, inference_gpus=1)
        ActorLayout(
            inference=({"num_cpus": 1, "scheduling_strategy": engine_bundle},),
            env_workers=tuple({"num_cpus": 1} for _ in range(4)),
        )
    """

    inference: tuple[Mapping[str, Any], ...]
    env_workers: tuple[Mapping[str, Any], ...]

    def __post_init__(self) -> None:
        if not self.inference or not self.env_workers:
            raise ValueError(
                f"a collector needs at least one inference actor and one env worker, got "
                f"{len(self.inference)} and {len(self.env_workers)}"
            )

    @classmethod
    def uniform(
        cls,
        *,
        env_workers: int = 2,
        inference_actors: int = 1,
        env_worker_cpus: float = 0.5,
        inference_cpus: float = 0.5,
        inference_gpus: float = 0.0,
    ) -> ActorLayout:
        """``env_workers`` and ``inference_actors`` actors, each with the same resources and
        no placement (give ``inference_gpus=1`` on a GPU machine)."""
        if env_workers < 1 or inference_actors < 1:
            raise ValueError(
                f"env_workers and inference_actors must be >= 1, got {env_workers} and "
                f"{inference_actors}"
            )
        inference = {"num_cpus": inference_cpus, "num_gpus": inference_gpus}
        return cls(
            inference=(inference,) * inference_actors,
            env_workers=({"num_cpus": env_worker_cpus},) * env_workers,
        )

    def inference_options(self, index: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Ray options of inference actor ``index``: a threaded actor serving its env workers
        and a weight load at once; ``extra`` (e.g. the runtime environment) added."""
        served = math.ceil(len(self.env_workers) / len(self.inference))
        return {**self.inference[index], "max_concurrency": served + 1, **extra}

    def env_worker_options(self, index: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Ray options of env worker ``index``, with ``extra`` added."""
        return {**self.env_workers[index], **extra}
