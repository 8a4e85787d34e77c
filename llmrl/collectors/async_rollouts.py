"""`AsyncRollouts`: collect the next batches in a background thread while the trainer learns,
never more than ``max_staleness`` policy versions ahead.

Batch ``k`` (1-based, counted from when iteration starts) is the one the trainer takes at its
``k``-th step, when its weights are at version ``start + k - 1``. The collector thread starts
batch ``k`` only once the engines hold version ``start + k - 1 - max_staleness`` or newer, so
every sample of it is at most ``max_staleness`` versions behind the weights that train on it:
the bound holds by construction, nothing is dropped. ``max_staleness: 0`` is on-policy (the
thread waits for every update); ``1`` overlaps one batch of sampling with each training step.

Weights are pushed between two batches, never in the middle of one (a lock guards both), so a
batch is drawn with one version, which every row records in ``policy_version``.

**Partial rollouts** (:mod:`llmrl.collectors.partial_rollouts`) carry replies in flight from
one batch into the next, across pushes: a row's ``policy_version`` is then its *oldest* token's,
and the bound above no longer holds by construction. Sampling then runs only ``lead`` batches
ahead (1: one batch collected while the trainer trains), which leaves ``max_staleness - lead``
versions for replies carried over, and each batch is checked when the trainer takes it: a
group holding a row more than ``max_staleness`` versions behind the trainer's weights is
refused whole (its G rows; ``collector/stale_groups_refused``, ``collector/stale_rows_refused``),
so the step trains on the other groups; a batch refused whole is replaced by the next one (as
an extra batch). The check is on with ``refuse_stale`` (the runtime sets it with partial
rollouts).

**Extra batches.** A step may take more than one batch (dynamic sampling's resample rounds,
:class:`~llmrl.collectors.DynamicSampler`): :meth:`AsyncRollouts.allow_extra_batch` lets the
thread draw one more batch at the current version before the next update. With ``e`` extra
batches allowed so far, batch ``k`` starts once the engines hold version
``start + k - 1 - e - max_staleness``; since a step at version ``v`` takes batch
``v - start + 1 + e`` (``e`` counted when it takes it, never fewer than when the batch
started), the bound still holds for every batch, and the batch a step asks for may always start.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDictBase

logger = logging.getLogger(__name__)

_DONE = object()


class AsyncRollouts:
    """Background collection over ``collector`` (see the module docstring).

    Args:
        collector: any collector (its ``update_policy_weights_`` pushes the weights).
        max_staleness: how many versions a sample may lag behind the trainer's weights.
        lead: how many batches sampling may run ahead of training (default ``max_staleness``;
            partial rollouts: 1, see the module docstring).
        refuse_stale: check each batch against the bound and refuse the groups beyond it
            (partial rollouts; multi-turn trajectories in flight across a push keep their
            earlier turns' versions and are not refused without it).

    Example:
        rollouts = AsyncRollouts(collector, max_staleness=1)
        for batch in rollouts:
            train_on(batch)
            rollouts.update_policy_weights_()
        rollouts.shutdown()
    """

    def __init__(
        self,
        collector: Any,
        max_staleness: int = 1,
        lead: int | None = None,
        refuse_stale: bool = False,
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        lead = max_staleness if lead is None else lead
        if not 0 <= lead <= max_staleness:
            raise ValueError(f"lead must be in [0, max_staleness={max_staleness}], got {lead}")
        self.collector = collector
        self.max_staleness, self.lead, self.refuse_stale = max_staleness, lead, refuse_stale
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # one of: collecting a batch, pushing weights
        self._versions = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_version = 0
        self._extra_batches = 0  # batches beyond one per version (see allow_extra_batch)
        self.stats = {"stale_groups_refused": 0, "stale_rows_refused": 0}

    @property
    def policy_version(self) -> int:
        """The version of the weights the engines hold."""
        return self.collector.policy_version

    def _may_start(self, batch: int) -> bool:
        needed = self._start_version + batch - 1 - self._extra_batches - self.lead
        return self._stop.is_set() or self.collector.policy_version >= needed

    def _run(self) -> None:
        batches = iter(self.collector)
        number = 0
        while not self._stop.is_set():
            number += 1
            with self._versions:
                self._versions.wait_for(lambda n=number: self._may_start(n))
            if self._stop.is_set():
                break
            try:
                with self._lock:
                    batch = next(batches)
            except StopIteration:
                break
            except BaseException as error:  # handed to the trainer, which re-raises it
                self._queue.put(error)
                return
            self._queue.put(batch)
        self._queue.put(_DONE)

    def __iter__(self) -> Iterator[TensorDictBase]:
        if self._thread is None:
            self._start_version = self.collector.policy_version
            self._thread = threading.Thread(target=self._run, name="llmrl-rollouts", daemon=True)
            self._thread.start()
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            batch = self._refuse_stale(item)
            if batch.batch_size[0] == 0 < item.batch_size[0]:  # all refused: take the next
                self.allow_extra_batch()
                continue
            yield batch

    def _refuse_stale(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` without the groups that hold a row beyond the staleness bound of the
        weights that train on it (the engines' version now: the trainer's)."""
        keys = batch.keys()
        if not self.refuse_stale or "policy_version" not in keys or "group_id" not in keys:
            return batch
        floor = self.policy_version - self.max_staleness
        versions = batch.get("policy_version").reshape(-1)
        groups = batch.get("group_id").reshape(-1)
        stale = groups[versions < floor].unique()
        if not stale.numel():
            return batch
        refused = torch.isin(groups, stale)
        self.stats["stale_groups_refused"] += int(stale.numel())
        self.stats["stale_rows_refused"] += int(refused.sum())
        logger.warning(
            "refused %d group(s) (%d rows) with a row older than version %d (trainer at %d, "
            "max_staleness %d)",
            stale.numel(),
            int(refused.sum()),
            floor,
            self.policy_version,
            self.max_staleness,
        )
        return batch[(~refused).nonzero().squeeze(-1)]

    def update_policy_weights_(self, weights: Any = None) -> Any:
        """Push weights through the collector (between batches) and let the thread go on."""
        with self._lock:
            stats = self.collector.update_policy_weights_(weights)
        with self._versions:
            self._versions.notify_all()
        return stats

    def allow_extra_batch(self) -> None:
        """Let the thread draw one more batch before the next weight update (for a step that
        takes several batches); the staleness bound still holds (see the module docstring)."""
        with self._versions:
            self._extra_batches += 1
            self._versions.notify_all()

    def metrics(self) -> dict[str, float]:
        """The collector's counters and the refusals' as tracker metrics (``collector/<name>``)."""
        refused = {f"collector/{name}": float(value) for name, value in self.stats.items()}
        return {**self.collector.metrics(), **refused}

    def state_dict(self) -> dict[str, Any]:
        """The collector's state, read between batches (never while one is being collected)."""
        with self._lock:
            return self.collector.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the collector's state (before iteration starts)."""
        with self._lock:
            self.collector.load_state_dict(state)

    def shutdown(self) -> None:
        """Stop the background thread (a batch being collected is finished first)."""
        self._stop.set()
        with self._versions:
            self._versions.notify_all()
        if self._thread is not None:
            self._thread.join()
