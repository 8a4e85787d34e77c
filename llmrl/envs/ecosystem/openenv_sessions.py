"""The client side of :class:`~llmrl.envs.ecosystem.openenv_env.OpenEnvTask`: one OpenEnv
client session per episode, all of a process's sessions on one event loop in a daemon thread
(a batch's calls run concurrently, each bounded by the task's ``timeout_s``), the server the
process started (``app`` or ``server_command``), and the failure log (the first traceback
once, then counts).

Nothing here pickles but the task: a process that unpickles it starts its own loop, clients
and server on first use (env workers connect lazily).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmrl.envs.ecosystem.openenv_env import OpenEnvTask

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'llmrl[ecosystem]'"
CLOSE_TIMEOUT_S = 5.0
"""Bound on closing one session (and on each stage of stopping a started server)."""


@dataclass
class Session:
    """One row's episode: its client, the last observation, the return so far, its failure."""

    client: Any = None
    observation: dict[str, Any] | None = None
    reward: float = 0.0  # the server's reward of the last step
    total: float = 0.0  # the sum of the step rewards
    done: bool = False
    failure: BaseException | None = None


class OpenEnvSessions:
    """The task's sessions in one process: an event loop in a daemon thread running every
    client (a batch's calls run concurrently, each bounded by ``timeout_s``), the server this
    process started (if any), and the failure log. Pickles as its task alone."""

    def __init__(self, task: OpenEnvTask) -> None:
        self.task = task
        self.failures = 0
        self._next_id = 0  # never reused, closes included: a stale row finds no session
        self._init_runtime()

    def _init_runtime(self) -> None:
        self.sessions: dict[int, Session] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client_cls: Any = None
        self._server: subprocess.Popen | None = None
        self._server_url: str | None = None
        self._server_log: Any = None
        self._starts = 0
        self._logged = False
        self._warned_start = False

    def __getstate__(self) -> dict[str, Any]:
        return {"task": self.task, "failures": 0, "_next_id": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # ------------------------------------------------------------------ episodes
    def open(self, reset_kwargs: list[dict[str, Any]]) -> list[int]:
        """Open and reset one session per entry (concurrently); returns their ids. A session
        that failed has ``failure`` set (and no client)."""
        ids = list(range(self._next_id, self._next_id + len(reset_kwargs)))
        self._next_id += len(reset_kwargs)
        self._ensure_loop()  # a missing `openenv` package raises: a setup error, not a row's
        try:
            url = self._url()
            results = self._run_all([self._open(url, kwargs) for kwargs in reset_kwargs])
        except Exception as error:  # (no server: every row fails, the run goes on)
            results = [error] * len(reset_kwargs)
        for sid, result in zip(ids, results, strict=True):
            session = self.sessions[sid] = Session()
            if isinstance(result, BaseException):
                self.fail(session, result, "resetting")
            else:
                session.client, step = result
                session.observation = dict(step.observation or {})
                session.done = bool(step.done)
        return ids

    def step(self, ids: list[int], actions: list[dict[str, Any] | None]) -> None:
        """Step the sessions whose action is not None (concurrently) and record the results."""
        todo = [(self.sessions[s], a) for s, a in zip(ids, actions, strict=True) if a is not None]
        try:
            results = self._run_all([self._step(s.client, a) for s, a in todo])
        except Exception as error:  # (the backstop timeout: the rows fail)
            results = [error] * len(todo)
        for (session, _), result in zip(todo, results, strict=True):
            if isinstance(result, BaseException):
                self.fail(session, result, "stepping")
                continue
            session.reward = float(result.reward or 0.0)
            session.total += session.reward
            session.observation = dict(result.observation or {})
            session.done = bool(result.done)

    def end(self, ids: list[int]) -> None:
        """Close the sessions of episodes that ended (best effort, concurrently)."""
        clients = [s.client for s in (self.sessions.pop(i, None) for i in ids) if s and s.client]
        if clients and self._loop is not None:
            with contextlib.suppress(Exception):
                self._run_all([_close_client(c) for c in clients], CLOSE_TIMEOUT_S)

    def fail(self, session: Session, error: BaseException, what: str) -> None:
        """Mark ``session`` failed; the first failure of the process is logged with its
        traceback, the others are counted."""
        session.failure = error  # its client (if any) closes with the episode's end
        self.failures += 1
        if self._logged:
            return
        self._logged = True
        hint = ""
        if "capacity" in str(error).lower():
            hint = (
                " (the server refused a session: it must accept one per row in flight, "
                "prompts_per_worker x num_samples per env worker: raise its max_concurrent_envs)"
            )
        logger.warning(
            "OpenEnv server %s failed while %s an episode: %s: %s%s. The row gets "
            "fallback_reward=%g and task_failed; later failures are counted (task_failed), "
            "not logged.",
            self._server_url or self.task.base_url or "(not started)",
            what,
            type(error).__name__,
            error,
            hint,
            self.task.fallback_reward,
            exc_info=(type(error), error, error.__traceback__),
        )

    def warn_once(self, message: str, *args: Any) -> None:
        """Log ``message`` once per process (the check of a group's starting states)."""
        if not self._warned_start:
            self._warned_start = True
            logger.warning(message, *args)

    # ------------------------------------------------------------------ the client side
    async def _open(self, url: str, kwargs: dict[str, Any]) -> tuple[Any, Any]:
        timeout = self.task.timeout_s
        client = self._client_cls(
            base_url=url, connect_timeout_s=timeout, message_timeout_s=timeout
        )
        try:
            await asyncio.wait_for(client.connect(), timeout)
            result = await asyncio.wait_for(client.reset(**kwargs), timeout)
        except BaseException:
            await _close_client(client)
            raise
        return client, result

    async def _step(self, client: Any, action: dict[str, Any]) -> Any:
        return await asyncio.wait_for(client.step(action), self.task.timeout_s)

    def _run_all(self, coroutines: list[Any], timeout: float | None = None) -> list[Any]:
        """Run ``coroutines`` on the loop at once; each result or its exception, in order."""
        if not coroutines:
            return []
        loop = self._ensure_loop()
        limit = timeout or self.task.timeout_s

        async def gather() -> list[Any]:
            bounded = [asyncio.wait_for(c, 2 * limit) for c in coroutines]
            return await asyncio.gather(*bounded, return_exceptions=True)

        future = asyncio.run_coroutine_threadsafe(gather(), loop)
        try:
            return future.result(timeout=2 * limit + 5.0)
        except BaseException:
            future.cancel()
            raise

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            try:
                from openenv.core.generic_client import GenericEnvClient
            except ImportError as error:
                raise ImportError(
                    f"the openenv task needs the `openenv` package ({INSTALL_HINT}): {error}"
                ) from error
            self._client_cls = GenericEnvClient
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=loop.run_forever, name="openenv-sessions", daemon=True
            )
            self._thread.start()
            self._loop = loop
        return self._loop

    # ------------------------------------------------------------------ the server
    def _url(self) -> str:
        """The server's URL; starts the server this process runs, or restarts it when it died
        (at most ``max_restarts`` times: then every reset fails at once)."""
        if self.task.base_url is not None:
            return self.task.base_url
        if self._server is not None and self._server.poll() is None:
            return str(self._server_url)
        if self._starts > self.task.max_restarts:
            raise RuntimeError(
                f"the OpenEnv server is down and was started {self._starts} times already "
                f"(task_options.max_restarts={self.task.max_restarts})"
            )
        if self._server is not None:
            logger.warning("restarting the OpenEnv server (it exited: %s)", self._server.returncode)
            self._stop_server()
        self._starts += 1
        self._start_server()
        return str(self._server_url)

    def _start_server(self) -> None:
        port = _free_port()
        task = self.task
        if task.app is not None:
            argv = [sys.executable, "-m", "uvicorn", task.app, "--host", "127.0.0.1"]
            argv += ["--port", str(port)]
        else:
            argv = [arg.replace("{port}", str(port)) for arg in task.server_command or []]
        self._server_log = tempfile.TemporaryFile()  # noqa: SIM115 (open while the server runs)
        self._server = subprocess.Popen(
            argv,
            cwd=task.server_cwd,
            stdout=self._server_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopping it stops its workers
        )
        weakref.finalize(self, _stop_process, self._server)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + task.start_timeout_s
        while time.monotonic() < deadline:
            if self._server.poll() is not None:
                break
            if _healthy(url):
                self._server_url = url
                logger.info("OpenEnv server %s started: %s", url, " ".join(argv))
                return
            time.sleep(0.2)
        tail = self._log_tail()
        self._stop_server()
        raise RuntimeError(
            f"the OpenEnv server ({' '.join(argv)}) did not answer {url}/health within "
            f"{task.start_timeout_s:g} s (task_options.start_timeout_s); its output:\n{tail}"
        )

    def _log_tail(self, chars: int = 4000) -> str:
        log = self._server_log
        if log is None:
            return ""
        log.seek(0)
        return log.read().decode("utf-8", "replace")[-chars:]

    def _stop_server(self) -> None:
        if self._server is not None:
            _stop_process(self._server)
        if self._server_log is not None:
            self._server_log.close()
        self._server = self._server_log = self._server_url = None

    def close(self) -> None:
        """Close every session, stop the loop and the server; usable again afterwards."""
        self.end(list(self.sessions))
        loop, thread = self._loop, self._thread
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(timeout=CLOSE_TIMEOUT_S)
            if not loop.is_running():
                loop.close()
        self._stop_server()
        self._init_runtime()


async def _close_client(client: Any) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.close(), CLOSE_TIMEOUT_S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop_process(process: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL after 5 s."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=CLOSE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=CLOSE_TIMEOUT_S)
