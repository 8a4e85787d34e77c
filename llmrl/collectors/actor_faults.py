"""Dead and hung Ray actors: finding them, and bounding how often one actor slot may be rebuilt.

:class:`~llmrl.collectors.RayLLMCollector` rebuilds an env worker or an inference actor whose
process died (killed, out of memory, a crashed node) instead of failing the batch. A slot that
keeps dying must still fail, with a message naming it: :class:`RestartBudget` counts rebuilds
per slot and raises :class:`ActorRestartsExhausted` past ``max_restarts``. An actor that hangs
past its deadline (:class:`~llmrl.core.deadlines.CallTimeout`) is killed by
:func:`kill_hung` while its slot has rebuilds left, and then rebuilt as a dead one; with none
left, the timeout itself stops the run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from llmrl.core.deadlines import CallTimeout, Deadline, Hung, settle
from llmrl.core.ray_helpers import import_ray

KILL_POLL_S = 0.1
"""How often :func:`await_death` looks whether a killed actor is gone."""
KILL_WAIT_S = 60.0
"""How long :func:`await_death` waits for Ray to report a killed actor dead."""


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

    def left(self, name: str) -> int:
        """Rebuilds ``name`` may still have."""
        return self.max_restarts - self.deaths.get(name, 0)


def kill_hung(actor: Any, name: str, budget: RestartBudget, timeout: CallTimeout) -> CallTimeout:
    """Kill ``actor`` (slot ``name``), which ran past a deadline, so that it is rebuilt as a dead
    one (the rebuild spends the budget); ``timeout``, noting the kill. Raises ``timeout`` (noting
    why) when the slot has no rebuild left: a hung actor that cannot be replaced stops the run.
    """
    ray = import_ray("Ray actor faults")
    if budget.left(name) <= 0:
        note = f"not rebuilt: max_actor_restarts={budget.max_restarts} spent on {name}"
        raise timeout.with_details(note) from timeout
    ray.kill(actor)
    await_death(actor, name)
    return timeout.with_details(f"{name} killed, to be rebuilt")


def await_death(actor: Any, name: str) -> None:
    """Return once Ray reports ``actor`` (just killed: ``ray.kill`` returns before the process
    is gone) dead, so that :func:`dead_actors` finds it: one ping, watched every
    :data:`KILL_POLL_S` (a hung actor answers it only after it dies, with the error), asked
    again when it was answered before the kill landed; at most :data:`KILL_WAIT_S`."""
    ray = import_ray("Ray actor faults")
    deadline, ping = Deadline(KILL_WAIT_S), actor.ready.remote()
    while deadline.left() > 0:
        done, _ = ray.wait([ping], timeout=KILL_POLL_S)
        if not done:
            continue
        try:
            ray.get(ping)
        except ray.exceptions.RayActorError:
            return
        time.sleep(KILL_POLL_S)
        ping = actor.ready.remote()
    raise RuntimeError(f"{name} was killed but Ray did not report it dead in {KILL_WAIT_S:g} s")


def is_actor_death(error: BaseException) -> bool:
    """Whether ``error`` says an actor is gone (``RayActorError``: died or unreachable)."""
    ray = import_ray("Ray actor faults")
    return isinstance(error, ray.exceptions.RayActorError)


def dead_actors(
    actors: Sequence[Any], timeout_s: float | None = None, role: str = "actor"
) -> dict[int, BaseException]:
    """Which of ``actors`` (handles with a ``ready()`` method) are dead, by index, with the
    error that says so. Call it when the actors are idle: a busy one answers late (past
    ``timeout_s``: :class:`~llmrl.core.deadlines.CallTimeout` naming the ``role`` and index)."""
    ray = import_ray("Ray actor faults")
    pings = [actor.ready.remote() for actor in actors]
    if timeout_s is not None and pings:
        settle(pings, timeout_s, Hung(role=role, call="ready (ping)").each(range(len(pings))))
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
