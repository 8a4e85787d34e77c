"""Env and policy factories whose Ray actors hang on cue: the actor's call sleeps (for an
hour: far past any test) at its N-th env reset, policy call or weight load, a given number of
times across processes, as an engine stuck in ``load_weights`` or a worker that never answers.

Built on :mod:`tests.reliability.dying_actors`: a :class:`HangSwitch` is a kill switch whose
``fire`` sleeps instead of dying, so its marker files count the hangs, and a replacement actor
(a new process, counting from zero again) knows whether it still has to hang. The runtime kills
the hung actor, so the sleep never ends on its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tests.reliability.dying_actors import DyingPolicyFactory, KillSwitch, _Dying

HANG_S = 3600.0
"""How long a hung call sleeps: longer than any test, so only a kill ends it."""


@dataclass(frozen=True)
class HangSwitch(KillSwitch):
    """Hang the calling thread at its ``at_call``-th call of :meth:`tick`, at most ``times``
    times in all (counted by the marker files ``<directory>/<name>-<k>``)."""

    def fire(self) -> None:
        """Sleep for :data:`HANG_S` (the caller never returns in a test's time)."""
        time.sleep(HANG_S)


class HangingLoad(_Dying):
    """A transformers policy with a ``load_weights`` (as a vLLM policy has) that hangs at the
    switch's N-th weight load; otherwise loads into the wrapped policy's model."""

    def __call__(self, td: Any) -> Any:
        return self._inner(td)

    def load_weights(self, weights: Any, version: int | None = None, checksum: Any = None) -> None:
        """Load ``(name, tensor)`` pairs, or hang when the switch says so."""
        self._tick()
        self._inner.model.load_state_dict(dict(weights))


@dataclass(frozen=True)
class HangingLoadFactory(DyingPolicyFactory):
    """``TinyPolicyFactory`` policies (``base``) whose weight load hangs as ``switch`` (a
    :class:`HangSwitch`) says; their calls are served as usual."""

    def __call__(self) -> HangingLoad:  # type: ignore[override]
        return HangingLoad(self.base(), self.switch)
