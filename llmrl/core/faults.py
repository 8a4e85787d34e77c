"""Fault injection for crash tests: SIGKILL this process at a chosen point of a training stage.

Set ``LLMRL_FAULT_AT="<phase>:<step>[:<n>]"`` and the process kills itself with SIGKILL (no
cleanup, no ``finally``, no final MLflow status: as if the node died) the ``n``-th time
(default 1) it reaches ``phase`` during training step ``step`` (1-based, the step the metrics
are logged at). The phases:

- ``generate``: the GRPO loop (the stage's driver process) is about to sample the step's
  rollouts;
- ``backward``: the gradients of a GRPO minibatch are computed, the optimizer has not stepped
  (``n`` picks the minibatch update within the step); reached in every trainer rank's actor,
  which dies (the stage then exits naming the rank);
- ``checkpoint_write``: :meth:`~llmrl.train.checkpoint.CheckpointWriter.save` (in GRPO: by
  trainer rank 0) of that step has
  written the weights and optimizer state but not the rest (``n=1``), or everything including
  the ``COMPLETE`` marker but not yet renamed the directory into place (``n=2``);
- ``log_metrics``: the tracker has sent the step's metrics to MLflow and not yet returned (the
  samples table, the checkpoint and its tag come later).

Before dying it writes one line to stderr, ``llmrl fault injection: SIGKILL at <spec>``, so a
test can tell the fault it planted from another crash. Unset (the normal case), a call costs
one environment lookup.

``LLMRL_HANG_AT="<phase>:<step>[:<n>]"`` plants a hang instead (:func:`hang_point`): the
calling thread sleeps for a day, as a call that never returns, for the runtime's deadlines
(``runtime.timeouts``) to end. Its phase: ``load_weights``, an inference engine loading a
pushed version (``step``: the version).

Example::

    LLMRL_FAULT_AT=backward:3 llmrl grpo --config configs/grpo.yaml   # dies in step 3
"""

from __future__ import annotations

import os
import signal
import sys
import time

FAULT_ENV = "LLMRL_FAULT_AT"
PHASES: tuple[str, ...] = ("generate", "backward", "checkpoint_write", "log_metrics")
"""The points :func:`fault_point` is called at, in the order a step reaches them."""
KILL_MESSAGE = "llmrl fault injection: SIGKILL at"
HANG_ENV = "LLMRL_HANG_AT"
HANG_PHASES: tuple[str, ...] = ("load_weights",)
"""The points :func:`hang_point` is called at."""
HANG_MESSAGE = "llmrl fault injection: hanging at"
HANG_S = 86_400.0

_hits: dict[tuple[str, int], int] = {}


def parse_fault(
    spec: str, phases: tuple[str, ...] = PHASES, env: str = FAULT_ENV
) -> tuple[str, int, int]:
    """``"<phase>:<step>[:<n>]"`` -> ``(phase, step, n)``; raises ValueError when malformed."""
    parts = spec.strip().split(":")
    if len(parts) not in (2, 3) or parts[0] not in phases:
        raise ValueError(f"{env}={spec!r}: expected <phase>:<step>[:<n>] with a phase in {phases}")
    try:
        step, n = int(parts[1]), int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise ValueError(f"{env}={spec!r}: step and n must be integers") from None
    if step < 1 or n < 1:
        raise ValueError(f"{env}={spec!r}: step and n must be at least 1")
    return parts[0], step, n


def _due(env: str, phases: tuple[str, ...], phase: str, step: int) -> str | None:
    """``$env``'s spec when this ``phase``, ``step`` and hit are the ones it names."""
    spec = os.environ.get(env)
    if not spec:
        return None
    target_phase, target_step, target_n = parse_fault(spec, phases, env)
    if (phase, int(step)) != (target_phase, target_step):
        return None
    key = (phase, int(step))
    _hits[key] = _hits.get(key, 0) + 1
    return spec if _hits[key] == target_n else None


def fault_point(phase: str, step: int) -> None:
    """SIGKILL this process if ``$LLMRL_FAULT_AT`` names this ``phase``, ``step`` and hit."""
    spec = _due(FAULT_ENV, PHASES, phase, step)
    if spec is not None:
        sys.stderr.write(f"{KILL_MESSAGE} {spec}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def hang_point(phase: str, step: int) -> None:
    """Sleep :data:`HANG_S` in this thread if ``$LLMRL_HANG_AT`` names this ``phase``,
    ``step`` and hit (module docstring)."""
    spec = _due(HANG_ENV, HANG_PHASES, phase, step)
    if spec is not None:
        sys.stderr.write(f"{HANG_MESSAGE} {spec}\n")
        sys.stderr.flush()
        time.sleep(HANG_S)
