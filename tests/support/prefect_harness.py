"""Prefect test helpers shared by ``tests/flows`` and ``tests/reliability``: a launcher that fails
a given number of times, and reading what a flow run left (artifacts, logs) from the API. (The
``prefect_api`` harness fixture is in ``tests/conftest.py``: one per session, whichever package
asks first.)"""

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


def prefect_client() -> Any:
    """A synchronous client of the current Prefect API (use it as a context manager)."""
    from prefect import get_client

    return get_client(sync_client=True)


def filter_by_flow_run(what: str, flow_run_id: Any, **extra: Any) -> list[dict[str, Any]]:
    """POST /<what>/filter by flow run (``artifacts``, ``logs``). (Prefect 3.8's clients send
    `null` for filters left out, which its server rejects or turns into joins, so the request is
    written here.)"""
    body = {what: {"flow_run_id": {"any_": [str(flow_run_id)]}}, "limit": 200, "offset": 0}
    with prefect_client() as client:
        return client.request("POST", f"/{what}/filter", json={**body, **extra}).json()
