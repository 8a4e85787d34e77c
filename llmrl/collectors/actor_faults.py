"""Dead Ray actors: finding them, and bounding how often one actor slot may be rebuilt.

:class:`~llmrl.collectors.RayLLMCollector` rebuilds an env worker or an inference actor whose
process died (killed, out of memory, a crashed node) instead of failing the batch. A slot that
keeps dying must still fail, with a message naming it: :class:`RestartBudget` counts rebuilds
per slot and raises :class:`ActorRestartsExhausted` past ``max_restarts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmrl.core.ray_helpers import import_ray


class ActorRestartsExhausted(RuntimeError):
    """An actor slot died more often than its restart budget allows."""

    def __init__(self, name: str, deaths: int, max_restarts: int, last_error: BaseException):
        self.name, self.deaths, self.max_restarts = name, deaths, max_restarts
        super().__init__(
            f"{name} died {deaths} times, more than max_actor_restarts={max_restarts} allows; "
            f"giving up (last error: {type(last_error).__name__}: {first_line(last_error)})"
        )


class RestartBudget:
    """Rebuilds allowed per actor slot (``"env worker 1"``, ``"inference actor 0"``)."""

    def __init__(self, max_restarts: int) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_actor_restarts must be >= 0, got {max_restarts}")
        self.max_restarts = max_restarts
        self.deaths: dict[str, int] = {}

    def spend(self, name: str, error: BaseException) -> None:
        """Record one death of ``name``; raises :class:`ActorRestartsExhausted` when it may not
        be rebuilt again."""
        deaths = self.deaths.get(name, 0) + 1
        self.deaths[name] = deaths
        if deaths > self.max_restarts:
            raise ActorRestartsExhausted(name, deaths, self.max_restarts, error) from error


def is_actor_death(error: BaseException) -> bool:
    """Whether ``error`` says an actor is gone (``RayActorError``: died or unreachable)."""
    ray = import_ray("Ray actor faults")
    return isinstance(error, ray.exceptions.RayActorError)


def dead_actors(actors: Sequence[Any]) -> dict[int, BaseException]:
    """Which of ``actors`` (handles with a ``ready()`` method) are dead, by index, with the
    error that says so. Call it when the actors are idle: a busy one answers late."""
    ray = import_ray("Ray actor faults")
    pings = [actor.ready.remote() for actor in actors]
    dead: dict[int, BaseException] = {}
    for index, ping in enumerate(pings):
        try:
            ray.get(ping)
        except ray.exceptions.RayActorError as error:
            dead[index] = error
    return dead


def first_line(error: BaseException) -> str:
    """The first line of an error's message (Ray's are long), or its type name."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
