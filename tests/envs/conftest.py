"""Fixtures of the env tests: the sandbox's (its working directories, a secret in the
caller's environment) and the MCP tools' (a test server's script)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.support.mcp_servers import CALC_SERVER
from tests.support.sandbox_checks import RECORDED_WORKDIRS, SECRET_NAME, SECRET_VALUE


@pytest.fixture
def secret_in_parent_env(monkeypatch):
    """The caller's environment holds a secret no sandbox may see (the sandbox modules use it
    for every test)."""
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)


@pytest.fixture
def workdirs(monkeypatch) -> list[str]:
    """Every temporary directory the sandbox creates during the test."""
    made: list[str] = []
    real = tempfile.mkdtemp

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        RECORDED_WORKDIRS.append(made[-1])
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording)
    return made


@pytest.fixture(scope="module")
def server_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "calc_server.py"
    path.write_text(CALC_SERVER)
    return path
