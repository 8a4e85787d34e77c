"""`ModelClient`: calls a model role with a deadline per call and bounded retries.

The client is what env workers and the driver hold (it pickles): it calls the role's
:class:`~llmrl.scorers.server.ModelServer` actors in turn (round robin; a retry goes to the
next server), or, for a role served by URL, a scorer its factory builds in the caller's process
on first use. Each attempt waits at most ``timeout_s``; after ``max_retries`` retries the call
raises :class:`~llmrl.scorers.errors.ModelCallError` naming the role, the server, the attempts
and the cause. It counts its own calls, failures, retries and latency (:meth:`metrics`).

Example::

    client = ModelClient(role="judge", servers=servers, timeout_s=30, max_retries=1)
    scores = client(requests)          # list[float | None], one per request
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import TYPE_CHECKING, Any

from llmrl.scorers.errors import ModelCallError, describe_error
from llmrl.scorers.server import CallStats

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    from llmrl.scorers.requests import ScoreRequest


class ModelClient:
    """A model role's calls (see the module docstring).

    Args:
        role: the role's name (``reward_model``, ``judge``, ``teacher``), for messages.
        servers: the role's server handles (:func:`~llmrl.scorers.server.start_model_servers`).
        factory: for a role without servers (a URL): builds the scorer in the caller's
            process on first use. Exactly one of ``servers`` and ``factory``.
        timeout_s: seconds one attempt may take.
        max_retries: attempts after the first.
    """

    def __init__(
        self,
        *,
        role: str,
        servers: Sequence[Any] = (),
        factory: Callable[[], Any] | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 1,
    ) -> None:
        if bool(servers) == (factory is not None):
            raise ValueError(
                f"{role}: a model client needs exactly one of servers (the role's Ray actors) "
                "and factory (a scorer built here, for a URL)"
            )
        if not timeout_s > 0 or max_retries < 0:
            raise ValueError(
                f"{role}: timeout_s must be > 0 and max_retries >= 0, got {timeout_s}, "
                f"{max_retries}"
            )
        self.role = role
        self.servers = list(servers)
        self.factory = factory
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._reset_local_state()

    def _reset_local_state(self) -> None:
        self.stats = CallStats()
        self.stats.add("retries", 0)
        self._lock = threading.Lock()
        self._next = 0
        self._scorer: Any = None
        self._pool: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        keep = ("role", "servers", "factory", "timeout_s", "max_retries")
        return {name: self.__dict__[name] for name in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_local_state()

    # ------------------------------------------------------------------ calls
    def __call__(self, requests: list[ScoreRequest]) -> list:
        """The role's result per request (scores; a judge's None for no verdict)."""
        if not requests:
            return []
        return self._call("call", list(requests))

    def score(self, td: TensorDictBase) -> TensorDictBase:
        """A tensordict scorer's output for ``td`` (the teacher's log-probs)."""
        return self._call("score", td)

    def metrics(self) -> dict[str, float]:
        """This client's ``requests``, ``failures`` (calls that raised), ``retries`` and
        ``latency_s_total`` / ``latency_s_max`` (seconds per call, retries included)."""
        return self.stats.snapshot()

    def close(self) -> None:
        """Release what this process built for a URL role (its scorer, its threads)."""
        with self._lock:
            scorer, pool, self._scorer, self._pool = self._scorer, self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(scorer, "close", None)
        if callable(close):
            close()

    def _call(self, method: str, payload: Any) -> Any:
        return self.stats.timed(lambda: self._attempts(method, payload))

    def _attempts(self, method: str, payload: Any) -> Any:
        attempts = self.max_retries + 1
        server: int | str = "local"
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                self.stats.add("retries")
            try:
                if self.servers:
                    with self._lock:
                        server, self._next = self._next, (self._next + 1) % len(self.servers)
                    return self._remote(server, method, payload)
                server = getattr(self.factory, "name", "local")
                return self._local(method, payload)
            except Exception as error:  # every fault of one attempt is retried, then reported
                cause = (
                    f"no answer within timeout_s={self.timeout_s:g} s"
                    if _timed_out(error)
                    else describe_error(error)
                )
                if attempt == attempts:
                    raise ModelCallError(self.role, server, attempts, cause) from error
        raise AssertionError("unreachable")

    def _remote(self, index: int, method: str, payload: Any) -> Any:
        import ray

        ref = getattr(self.servers[index], method).remote(payload)
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            with contextlib.suppress(Exception):  # a task already finished or not cancellable
                ray.cancel(ref)
            raise

    def _local(self, method: str, payload: Any) -> Any:
        with self._lock:
            if self._scorer is None:
                assert self.factory is not None
                self._scorer = self.factory()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.max_retries + 1, thread_name_prefix=f"llmrl-{self.role}-client"
                )
            scorer, pool = self._scorer, self._pool
        function = scorer if method == "call" else getattr(scorer, "score", scorer)
        future = pool.submit(function, payload)
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeoutError:
            future.cancel()
            raise

    def __repr__(self) -> str:
        where = f"{len(self.servers)} servers" if self.servers else "in process"
        return f"ModelClient({self.role!r}, {where})"


def _timed_out(error: BaseException) -> bool:
    """Whether an attempt failed by waiting past its deadline (here, or in ``ray.get``)."""
    timeouts = (TimeoutError, FutureTimeoutError)
    return isinstance(error, timeouts) or type(error).__name__ == "GetTimeoutError"
