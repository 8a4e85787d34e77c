"""`ModelServer`: one model role's scorer in a Ray actor, batching its concurrent callers.

A model role (``reward_model``, ``judge``, ``teacher``) runs one or more servers, each hosting
the scorer its factory builds (the model is loaded in the actor). The actor is threaded
(``max_concurrency``): the requests of concurrent callers (several env workers) wait in a
:class:`~llmrl.policies.batching.RequestBatcher` and reach the scorer as ONE call of up to
``batch_rows`` rows, or of what arrived within ``batching_timeout_s`` of the oldest. Tensordict
scorers (the teacher) are called through :meth:`ModelServer.score`, one batch at a time.

:func:`start_model_servers` starts a role's servers with Ray's restart options: a server that
dies is rebuilt by Ray (its factory runs again) and its handle stays valid.

Example::

    servers = start_model_servers(
        "reward_model", factory, actor_options=[{"num_cpus": 1}], max_restarts=3,
        max_task_retries=3,
    )
    client = ModelClient(role="reward_model", servers=servers, timeout_s=60, max_retries=1)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from llmrl.policies.batching import RequestBatcher
from llmrl.scorers.errors import describe_error

if TYPE_CHECKING:
    from tensordict import TensorDictBase

READY_TIMEOUT_S = 900.0
"""Seconds a server may take to build its scorer (load a model, start a vLLM engine)."""


class CallStats:
    """Counts of calls and their latency (thread-safe): ``requests``, ``failures``,
    ``latency_s_total`` and ``latency_s_max``, plus any counters added with :meth:`add`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, float] = {
            "requests": 0.0,
            "failures": 0.0,
            "latency_s_total": 0.0,
            "latency_s_max": 0.0,
        }

    def add(self, name: str, amount: float = 1.0) -> None:
        """Add ``amount`` to the counter ``name``."""
        with self._lock:
            self.values[name] = self.values.get(name, 0.0) + amount

    def timed(self, call: Callable[[], Any]) -> Any:
        """Run ``call``, counting it as one request (a failure if it raises) and its seconds."""
        start = time.monotonic()
        try:
            return call()
        except BaseException:
            self.add("failures")
            raise
        finally:
            seconds = time.monotonic() - start
            with self._lock:
                self.values["requests"] += 1
                self.values["latency_s_total"] += seconds
                self.values["latency_s_max"] = max(self.values["latency_s_max"], seconds)

    def snapshot(self) -> dict[str, float]:
        """The counters now."""
        with self._lock:
            return dict(self.values)


class ModelServer:
    """Hosts the scorer ``factory()`` builds (see the module docstring); use as a threaded
    Ray actor class, ``ray.remote(ModelServer).options(max_concurrency=...)``.

    Args:
        factory: builds the scorer (called once here, again when Ray restarts the actor).
        role: the model role, for messages and the batcher thread's name.
        batch_rows: most rows of one scorer call (one caller's larger request goes alone).
        batching_timeout_s: how long the first waiting request waits for others.
    """

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        role: str,
        batch_rows: int = 64,
        batching_timeout_s: float = 0.05,
    ) -> None:
        self.role = role
        self.scorer = factory()
        self.stats = CallStats()
        self.stats.add("rows", 0)
        self.stats.add("batches", 0)
        self._score_lock = threading.Lock()
        self._batcher: RequestBatcher[list, list] = RequestBatcher(
            self._process,
            min_batch_size=batch_rows,
            max_batch_size=batch_rows,
            timeout=batching_timeout_s,
            name=f"llmrl-{role}-server",
            size=len,
        )

    def ready(self) -> bool:
        """True once the scorer is built (the actor answers only after ``__init__``)."""
        return True

    def call(self, requests: list) -> list:
        """One result per request (a text scorer's scores), batched with concurrent calls."""
        if not requests:
            return []
        return self.stats.timed(lambda: self._batcher(list(requests)))

    def score(self, td: TensorDictBase) -> TensorDictBase:
        """A tensordict scorer's output for ``td`` (no batching: one batch at a time)."""
        self.stats.add("rows", td.batch_size[0] if td.batch_dims else 1)
        self.stats.add("batches")
        return self.stats.timed(lambda: self._score_locked(td))

    def metrics(self) -> dict[str, float]:
        """``requests``, ``rows``, ``batches`` (scorer calls), ``failures`` and
        ``latency_s_total`` / ``latency_s_max`` (seconds per request) since the start."""
        return self.stats.snapshot()

    def close(self) -> None:
        """Stop batching and release the scorer (its engine's processes, connections)."""
        self._batcher.close()
        close = getattr(self.scorer, "close", None)
        if callable(close):
            close()

    def _score_locked(self, td: TensorDictBase) -> TensorDictBase:
        with self._score_lock:
            return self.scorer(td)

    def _process(self, groups: list[list]) -> list[list]:
        """One scorer call for the requests of several callers; each gets its own part."""
        flat = [request for group in groups for request in group]
        self.stats.add("rows", len(flat))
        self.stats.add("batches")
        with self._score_lock:
            results = list(self.scorer(flat))
        if len(results) != len(flat):
            raise RuntimeError(
                f"{self.role}: the scorer returned {len(results)} results for {len(flat)} rows"
            )
        parts, start = [], 0
        for group in groups:
            parts.append(results[start : start + len(group)])
            start += len(group)
        return parts

    def __repr__(self) -> str:
        return f"ModelServer({self.role!r})"


def start_model_servers(
    role: str,
    factory: Callable[[], Any],
    *,
    actor_options: Sequence[dict[str, Any]],
    max_restarts: int,
    max_task_retries: int,
    max_concurrency: int = 16,
    batch_rows: int = 64,
    batching_timeout_s: float = 0.05,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> list[Any]:
    """Start one :class:`ModelServer` per entry of ``actor_options`` (each one's Ray options:
    resources, placement, runtime env), wait until every one is ready and return their handles.

    Raises:
        RuntimeError: a server failed to build its scorer or was not ready in
            ``ready_timeout_s``; names the role and the server, and the servers are stopped.
    """
    import ray

    actor_class = ray.remote(ModelServer)
    servers = []
    for options in actor_options:
        opts = {
            **options,
            "max_concurrency": max_concurrency,
            "max_restarts": max_restarts,
            "max_task_retries": max_task_retries,
        }
        servers.append(
            actor_class.options(**opts).remote(
                factory, role=role, batch_rows=batch_rows, batching_timeout_s=batching_timeout_s
            )
        )
    for index, server in enumerate(servers):
        try:
            ray.get(server.ready.remote(), timeout=ready_timeout_s)
        except Exception as error:
            for started in servers:
                ray.kill(started, no_restart=True)
            raise RuntimeError(
                f"{role} server {index} did not start: {describe_error(error)}"
            ) from error
    return servers
