"""Group single requests from many concurrent callers into batches for one worker thread."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Generic, TypeVar

Req = TypeVar("Req")
Res = TypeVar("Res")


class BatchingClosedError(RuntimeError):
    """The batcher was closed before (or while) the request could be served."""


class RequestBatcher(Generic[Req, Res]):
    """Serve many concurrent single requests with one batched ``process`` call per batch.

    Callers (threads, env workers) each :meth:`submit` one request and get a
    :class:`~concurrent.futures.Future`, or call the batcher to submit and wait. One daemon worker
    thread, named ``name`` and started lazily on the first submit, groups pending requests and
    calls ``process(batch)``, which must return one result per request, in the same order.

    Semantics:

    * Sizes count ``size(request)`` per request (default 1: requests; a policy counts a
      request's rows, so an engine waiting for a step's 64 rows serves two workers' 32-row
      requests as soon as both are in, not after ``timeout``).
    * The worker waits until requests of total size at least ``min_batch_size`` are pending, or
      until ``timeout`` seconds have passed since the *oldest* pending request arrived, then
      takes requests in FIFO order while their total stays within ``max_batch_size`` (always at
      least one). A lone small request is served after ~``timeout``.
    * If ``process`` raises, every request of that batch gets that exception; if it returns the
      wrong number of results, every request gets a ``RuntimeError``. Later batches still run.
    * Requests whose future was cancelled before their batch started are skipped (they still
      count towards ``min_batch_size`` while they wait). ``__call__`` cancels its request when
      its own ``timeout`` expires.
    * ``close()`` fails pending requests with :class:`BatchingClosedError`;
      ``close(cancel_pending=False)`` serves them first. Either way the batch already in
      ``process`` finishes and ``close`` joins the worker. Submitting after close raises
      :class:`BatchingClosedError`.

    Example::

        with RequestBatcher(lambda xs: [x * 10 for x in xs], max_batch_size=8) as batcher:
            futures = [batcher.submit(i) for i in range(20)]  # or batcher(i) from many threads
            assert [f.result() for f in futures] == [i * 10 for i in range(20)]
    """

    def __init__(
        self,
        process: Callable[[list[Req]], list[Res]],
        *,
        min_batch_size: int = 1,
        max_batch_size: int = 32,
        timeout: float = 0.05,
        name: str = "llmrl-batcher",
        size: Callable[[Req], int] | None = None,
    ) -> None:
        if min_batch_size < 1:
            raise ValueError(f"min_batch_size must be >= 1, got {min_batch_size}")
        if max_batch_size < min_batch_size:
            raise ValueError(
                f"max_batch_size must be >= min_batch_size ({min_batch_size}), got {max_batch_size}"
            )
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self._process = process
        self.min_batch_size = min_batch_size
        self.max_batch_size = max_batch_size
        self.timeout = timeout
        self.name = name
        self._size = size or (lambda _request: 1)
        self._cond = threading.Condition()
        self._queue: deque[tuple[Req, Future[Res], float]] = deque()
        self._queued = 0  # total size of the queued requests
        self._closed = False
        self._drain = False
        self._thread: threading.Thread | None = None
        self._batches = 0

    @property
    def pending(self) -> int:
        """Number of requests waiting for a batch (not counting the batch being processed)."""
        with self._cond:
            return len(self._queue)

    @property
    def batches_processed(self) -> int:
        """Number of times ``process`` has been called (failed calls included)."""
        with self._cond:
            return self._batches

    def submit(self, request: Req) -> Future[Res]:
        """Queue ``request`` and return a future for its result."""
        future: Future[Res] = Future()
        with self._cond:
            if self._closed:
                raise BatchingClosedError(f"{self.name} is closed")
            self._queue.append((request, future, time.monotonic()))
            self._queued += self._size(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return future

    def __call__(self, request: Req, timeout: float | None = None) -> Res:
        """Submit ``request`` and wait for its result (``TimeoutError`` cancels the request)."""
        future = self.submit(request)
        try:
            return future.result(timeout)
        except FutureTimeoutError:
            future.cancel()
            raise

    def close(self, cancel_pending: bool = True) -> None:
        """Stop the worker: fail (or, with ``cancel_pending=False``, serve) pending requests.

        Idempotent; a later ``close()`` with ``cancel_pending=True`` cancels what a draining
        close has not served yet. Joins the worker unless called from ``process`` itself.
        """
        cancelled: list[tuple[Req, Future[Res], float]] = []
        with self._cond:
            if not self._closed:
                self._drain = not cancel_pending
            self._closed = True
            if cancel_pending:
                self._drain = False
                cancelled = list(self._queue)
                self._queue.clear()
                self._queued = 0
            self._cond.notify_all()
            thread = self._thread
        for _, future, _ in cancelled:
            if future.set_running_or_notify_cancel():
                future.set_exception(BatchingClosedError(f"{self.name} closed before serving"))
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def __enter__(self) -> RequestBatcher[Req, Res]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _next_batch(self) -> list[tuple[Req, Future[Res], float]] | None:
        """Wait (holding the lock) for the next batch; ``None`` means the worker should stop."""
        while True:
            if self._closed and not (self._drain and self._queue):
                return None
            if not self._queue:
                self._cond.wait()
                continue
            if self._closed or self._queued >= self.min_batch_size:
                break
            remaining = self._queue[0][2] + self.timeout - time.monotonic()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
        batch = [self._queue.popleft()]
        total = self._size(batch[0][0])
        while self._queue:
            size = self._size(self._queue[0][0])
            if total + size > self.max_batch_size:
                break
            total += size
            batch.append(self._queue.popleft())
        self._queued -= total
        return batch

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._next_batch()
            if batch is None:
                return
            live = [(req, fut) for req, fut, _ in batch if fut.set_running_or_notify_cancel()]
            if live:
                self._serve(live)

    def _serve(self, live: list[tuple[Req, Future[Res]]]) -> None:
        """Run ``process`` on one batch and resolve every future in it, whatever happens."""
        with self._cond:
            self._batches += 1
        try:
            results = list(self._process([req for req, _ in live]))
            if len(results) != len(live):
                raise RuntimeError(
                    f"process returned {len(results)} results for a batch of {len(live)} requests"
                )
        except BaseException as exc:  # the worker must survive and no caller may hang
            for _, future in live:
                future.set_exception(exc)
            return
        for (_, future), result in zip(live, results, strict=True):
            future.set_result(result)
