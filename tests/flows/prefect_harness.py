"""Prefect test helpers shared by ``tests/flows`` and ``tests/reliability``: a launcher that fails
a given number of times. (The ``prefect_api`` harness fixture is in ``tests/conftest.py``: one
per session, whichever package asks first.)"""

from __future__ import annotations

from typing import Any

from flows.launchers import StageResult


class FlakyLauncher:
    """A launcher that fails with ``error`` the first ``failures`` times, then returns an
    evaluation-like summary (accuracy 0.5 on 4 problems)."""

    def __init__(self, error: Exception, failures: int) -> None:
        self.error, self.failures, self.calls = error, failures, 0

    def run(self, stage: str, config_path: Any, overrides: Any, env: Any, *, name=None):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return StageResult({"accuracy": 0.5, "num_problems": 4}, "", 0.1)
