"""Prefect test helpers shared by ``tests/flows`` and ``tests/reliability``: the test harness
fixture and a launcher that fails a given number of times.

Import ``prefect_api`` into a test module to use it
(``from tests.flows.prefect_harness import prefect_api  # noqa: F401``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flows.launchers import StageResult


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Prefect's test harness (a temporary API and database), PREFECT_HOME in a temp folder."""
    from prefect.settings import (
        PREFECT_HOME,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect-home")
    updates = {PREFECT_HOME: str(home), PREFECT_SERVER_ANALYTICS_ENABLED: False}
    with temporary_settings(updates=updates), prefect_test_harness(server_startup_timeout=120):
        yield


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
