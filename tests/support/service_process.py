"""A server the tests start as a subprocess (``mlflow server``, ``prefect server start``): one
command and environment, a health URL to wait for, and stop / start / restart on the same port.

It runs in its own process group (``start_new_session``), so :meth:`ServiceProcess.stop` ends the
workers it forked too (uvicorn), and waits until its port is closed before it returns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether ``url`` answers a GET with 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class ServiceProcess:
    """``argv`` with ``env`` in ``cwd``, healthy when ``health_url`` answers 200; its output
    appends to ``log_path`` across restarts. ``url`` is ``http://127.0.0.1:<port>``;
    ``start_seconds`` records how long each start took."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        port: int,
        health_url: str,
        log_path: Path,
        cwd: Path,
        name: str,
    ) -> None:
        self.argv, self.env = list(argv), dict(env)
        self.port, self.health_url = port, health_url
        self.url = f"http://127.0.0.1:{port}"
        self.log_path, self.cwd, self.name = log_path, cwd, name
        self.proc: subprocess.Popen | None = None
        self.start_seconds: list[float] = []

    @property
    def running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 90.0) -> None:
        """Start the process and wait until it is healthy (raises with the log's tail if it
        exits or stays unhealthy for ``timeout`` seconds)."""
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                start_new_session=True,
            )  # fmt: skip
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            if answers(self.health_url):
                self.start_seconds.append(time.monotonic() - t0)
                return
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.name} not healthy after {timeout} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the process group (SIGKILL after 15 s) and wait until the port is closed."""
        if not self.running:
            return
        pgid = self.proc.pid  # the group start() created
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=15)
        deadline = time.monotonic() + 15
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        if port_open(self.port):  # a worker outlived its parent
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)

    def restart(self) -> None:
        """Stop, then start again with the same command, port and store."""
        self.stop()
        self.start()

    def log_tail(self, n: int = 4000) -> str:
        """The last ``n`` characters the process wrote."""
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""
