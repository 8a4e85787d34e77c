"""A real ``mlflow server`` (SQLite backend, local artifact root) from this venv on a free port.

:class:`MlflowServer`'s ``.uri`` is the tracking URI; ``.stop()``, ``.start()`` and ``.restart()``
take it down and up again on the same port and store (outage tests). The ``mlflow_server``
fixture (``tests/conftest.py``) starts one per module. The server the Helm chart configures, on
PostgreSQL, is :func:`tests.support.chart_services.chart_service`'s.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.support.service_process import ServiceProcess, free_port

__all__ = ["MlflowServer", "free_port"]


class MlflowServer(ServiceProcess):
    """``mlflow server`` as a subprocess, with its store under ``root`` (survives restarts)."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        port = port or free_port()
        self.uri = f"http://127.0.0.1:{port}"
        self.backend_uri = f"sqlite:///{root / 'mlflow.db'}"
        self.artifact_root = (root / "artifacts").as_uri()
        home = root / "home"
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
        argv = [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            self.backend_uri,
            "--default-artifact-root",
            self.artifact_root,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ]
        super().__init__(
            argv, env, port=port, health_url=self.uri + "/health", log_path=root / "server.log",
            cwd=root, name="mlflow server",
        )  # fmt: skip

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait for ``/health`` (raises with the log tail on failure)."""
        super().start(timeout)
