"""`AsyncRollouts`: keep sampling in a background thread while the trainer learns.

The collector runs in its own thread with its own copy of the weights and hands finished batches
over through a queue. It starts a batch only while fewer than ``prefetch`` batches are ahead of
the trainer (queued or being collected), so a batch is at most ``prefetch`` policy versions old
when the trainer takes it. ``update_policy_weights_`` copies the trainer's weights into the
sampler between two batches (never in the middle of one: a lock guards both) and bumps the
policy version, so every batch says which weights produced it and the trainer can drop batches
that are too stale.
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
    """Background collection over a collector whose policy has its own model copy."""

    def __init__(self, collector: Any, trainer_model: torch.nn.Module, prefetch: int = 1) -> None:
        self.collector = collector
        self.trainer_model = trainer_model
        self._queue: queue.Queue = queue.Queue()
        self._ahead = threading.Semaphore(prefetch)  # batches the trainer has not taken yet
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def policy_version(self) -> int:
        return self.collector.policy_version

    def _run(self) -> None:
        batches = iter(self.collector)
        while not self._stop.is_set():
            if not self._ahead.acquire(timeout=0.1):  # `prefetch` batches already ahead
                continue
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
            self._thread = threading.Thread(target=self._run, name="llmrl-rollouts", daemon=True)
            self._thread.start()
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            self._ahead.release()  # taken: the collector may start the next one
            yield item

    def update_policy_weights_(self) -> None:
        """Copy the trainer's weights into the sampler (between batches) and bump the version."""
        with self._lock:
            self.collector.update_policy_weights_(self.trainer_model.state_dict())

    def metrics(self) -> dict[str, float]:
        """The collector's counters as tracker metrics (``collector/<name>``)."""
        return self.collector.metrics()

    def state_dict(self) -> dict[str, Any]:
        """The collector's state, read between batches (never while one is being collected)."""
        with self._lock:
            return self.collector.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.collector.load_state_dict(state)

    def shutdown(self) -> None:
        """Stop the background thread (a batch being collected is finished first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
