"""Env and policy factories whose Ray actors die on cue: a real ``SIGKILL`` of the actor's
process at its N-th env reset or policy call, a given number of times across processes.

Ray actors import this module to rebuild the factories (so it imports no test fixtures). Each
death leaves a marker file in the switch's folder: the test counts them, and a replacement
actor (a new process, counting from zero again) knows whether it still has to die.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensordict import TensorDictBase

from tests.support.factories import ArithmeticEnvFactory, TinyPolicyFactory


@dataclass(frozen=True)
class KillSwitch:
    """Kill the calling process at its ``at_call``-th call of :meth:`tick`, at most ``times``
    times in all (counted by the marker files ``<directory>/<name>-<k>``)."""

    directory: str
    name: str
    at_call: int
    times: int = 1

    def kills(self) -> int:
        """How many processes this switch killed so far."""
        return len(list(Path(self.directory).glob(f"{self.name}-*")))

    def tick(self, call: int) -> None:
        """Called with this process's call count (1, 2, ...); dies when due."""
        done = self.kills()
        if call != self.at_call or done >= self.times:
            return
        (Path(self.directory) / f"{self.name}-{done}").write_text(str(os.getpid()))
        self.fire()

    def fire(self) -> None:
        """What happens when due: this process dies (SIGKILL)."""
        os.kill(os.getpid(), signal.SIGKILL)


class _Dying:
    """Forwards every attribute to ``inner``; counts calls of one method and ticks the switch."""

    def __init__(self, inner: Any, switch: KillSwitch) -> None:
        self._inner, self._switch, self._calls = inner, switch, 0

    def _tick(self) -> None:
        self._calls += 1
        self._switch.tick(self._calls)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class DyingEnv(_Dying):
    """An env whose process dies at the switch's N-th ``reset``."""

    def reset(self, td: TensorDictBase | None = None) -> TensorDictBase:
        self._tick()
        return self._inner.reset(td)


class DyingPolicy(_Dying):
    """A policy whose process dies at the switch's N-th call."""

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        self._tick()
        return self._inner(td)


@dataclass(frozen=True)
class DyingEnvFactory:
    """``ArithmeticEnvFactory`` envs; worker ``worker_index``'s dies as ``switch`` says."""

    switch: KillSwitch
    worker_index: int
    base: ArithmeticEnvFactory = field(default_factory=ArithmeticEnvFactory)

    def __call__(self, worker_index: int) -> Any:
        env = self.base(worker_index)
        return DyingEnv(env, self.switch) if worker_index == self.worker_index else env


@dataclass(frozen=True)
class DyingPolicyFactory:
    """``TinyPolicyFactory`` policies whose actor process dies as ``switch`` says."""

    switch: KillSwitch
    base: TinyPolicyFactory = field(default_factory=TinyPolicyFactory)

    def __call__(self) -> DyingPolicy:
        return DyingPolicy(self.base(), self.switch)
