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

Example::

    LLMRL_FAULT_AT=backward:3 llmrl grpo --config configs/grpo.yaml   # dies in step 3
"""

from __future__ import annotations

import os
import signal
import sys

FAULT_ENV = "LLMRL_FAULT_AT"
PHASES: tuple[str, ...] = ("generate", "backward", "checkpoint_write", "log_metrics")
"""The points :func:`fault_point` is called at, in the order a step reaches them."""
KILL_MESSAGE = "llmrl fault injection: SIGKILL at"

_hits: dict[tuple[str, int], int] = {}


def parse_fault(spec: str) -> tuple[str, int, int]:
    """``"<phase>:<step>[:<n>]"`` -> ``(phase, step, n)``; raises ValueError when malformed."""
    parts = spec.strip().split(":")
    if len(parts) not in (2, 3) or parts[0] not in PHASES:
        raise ValueError(
            f"{FAULT_ENV}={spec!r}: expected <phase>:<step>[:<n>] with a phase in {PHASES}"
        )
    try:
        step, n = int(parts[1]), int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise ValueError(f"{FAULT_ENV}={spec!r}: step and n must be integers") from None
    if step < 1 or n < 1:
        raise ValueError(f"{FAULT_ENV}={spec!r}: step and n must be at least 1")
    return parts[0], step, n


def fault_point(phase: str, step: int) -> None:
    """SIGKILL this process if ``$LLMRL_FAULT_AT`` names this ``phase``, ``step`` and hit."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    target_phase, target_step, target_n = parse_fault(spec)
    if (phase, int(step)) != (target_phase, target_step):
        return
    key = (phase, int(step))
    _hits[key] = _hits.get(key, 0) + 1
    if _hits[key] == target_n:
        sys.stderr.write(f"{KILL_MESSAGE} {spec}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
