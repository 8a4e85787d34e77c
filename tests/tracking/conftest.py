"""Fixtures for tracking tests: an isolated MLflow environment and a SQLite store.

The real server (``mlflow_server``) is in ``tests/conftest.py``, its class in
:mod:`tests.support.mlflow_server`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_MLFLOW_ENV_TO_CLEAR = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_PARENT_RUN_ID",
    "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING",
    "LLMRL_MLFLOW_SPOOL",
)


@pytest.fixture(autouse=True)
def _isolated_mlflow_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep MLflow away from the user's home, env and working directory."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    # what Tracker would set as process-wide defaults; monkeypatch restores them afterwards
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    for name in _MLFLOW_ENV_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def sqlite_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the session (creating its tables takes seconds), with the
    ``llmrl`` experiment's artifacts in a temporary folder."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("mlflow-sqlite")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(root))
        mp.setenv("XDG_CONFIG_HOME", str(root / ".config"))
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        artifacts = (root / "artifacts").as_uri()
        MlflowClient(uri).create_experiment("llmrl", artifact_location=artifacts)
    return uri
