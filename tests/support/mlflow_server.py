"""A real ``mlflow server`` (SQLite backend, local artifact root) from this venv on a free port.

:class:`MlflowServer`'s ``.uri`` is the tracking URI; ``.stop()``, ``.start()`` and ``.restart()``
take it down and up again on the same port and store (outage tests). The ``mlflow_server``
fixture (``tests/conftest.py``) starts one per module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class MlflowServer:
    """``mlflow server`` as a subprocess, with its store under ``root`` (survives restarts)."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.backend_uri = f"sqlite:///{root / 'mlflow.db'}"
        self.artifact_root = (root / "artifacts").as_uri()
        self.log_path = root / "server.log"
        self.proc: subprocess.Popen | None = None
        self.start_seconds: list[float] = []  # how long each start took to be healthy

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait for ``/health`` (raises with the log tail on failure)."""
        home = self.root / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "MLFLOW_DISABLE_TELEMETRY": "true",
            # no huey job-executor processes: not needed for tracking, and they slow the start
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        }
        env.pop("MLFLOW_TRACKING_URI", None)
        cmd = [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            self.backend_uri,
            "--default-artifact-root",
            self.artifact_root,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
                start_new_session=True,  # its own process group: stop() ends uvicorn too
            )  # fmt: skip
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=1) as r:
                    if r.status == 200:
                        self.start_seconds.append(time.monotonic() - t0)
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"mlflow server not healthy after {timeout} s:\n{self._log_tail()}")

    def stop(self) -> None:
        """Terminate the server's process group and wait until the port is closed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # the group this fixture started (start_new_session)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=15)
        deadline = time.monotonic() + 15
        while _port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _port_open(self.port):  # a worker outlived its parent
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)

    def restart(self) -> None:
        """Stop, then start again on the same port and store."""
        self.stop()
        self.start()

    def _log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""
