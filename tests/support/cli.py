"""``llmrl`` in a subprocess: its environment, a run to completion, a run in the background."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.paths import REPO


def cli_env(tmp_path: Path, mlflow_uri: str | None = None) -> dict[str, str]:
    """The environment of an ``llmrl`` subprocess: this session's cache, the given store."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LLMRL_MLFLOW_SPOOL": str(tmp_path / "spool")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if mlflow_uri is not None:
        env["MLFLOW_TRACKING_URI"] = mlflow_uri
    return env


def run_cli(
    args: list[str], tmp_path: Path, mlflow_uri: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m llmrl.cli ARGS`` in ``tmp_path``; returns the completed process (text)."""
    return subprocess.run(
        [sys.executable, "-m", "llmrl.cli", *args],
        cwd=tmp_path,
        env=cli_env(tmp_path, mlflow_uri),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(
    args: list[str],
    tmp_path: Path,
    log: Path,
    mlflow_uri: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start ``python -m llmrl.cli ARGS`` in ``tmp_path``, stdout and stderr into ``log``;
    ``env`` adds to :func:`cli_env`."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "llmrl.cli", *args],
            cwd=tmp_path,
            env={**cli_env(tmp_path, mlflow_uri), **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_until(process: subprocess.Popen, done: Any, log: Path, timeout: float = 240) -> None:
    """Poll until ``done()`` is true; fails with ``log`` when the process exits or time is up."""
    deadline = time.monotonic() + timeout
    while not done():
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"timed out waiting:\n{log.read_text()}"
        time.sleep(0.05)
