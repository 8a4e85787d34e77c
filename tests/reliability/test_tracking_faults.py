"""Tracking faults: the MLflow server stops in the middle of a real (tiny-model) SFT stage.

The stage runs in this process through the CLI's entry point (``llmrl.cli.main``) against a
real ``mlflow server`` (SQLite, 127.0.0.1); the server is stopped right after step 2's metrics
were sent. Training must go on to the last step, and no metric may be lost:

- the server comes back mid-run: the spool is replayed on the next logging call, and every
  step's metrics are in MLflow exactly once;
- the server stays away: the summary line names the spool file, which holds every metric
  MLflow did not get; replaying it (``flush_spool``) once the server is back completes the run.

``tests/tracking/test_tracker.py`` covers the same outage for a bare :class:`Tracker`; here
it happens under a training stage.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmrl.tracking import flush_spool
from tests.support.metrics_tap import MetricsTap, assert_every_step_once, sft_runner, spooled
from tests.support.mlflow_server import MlflowServer
from tests.support.stages import run_id_of

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("isolated_stage")]

STEPS = 6
STOP_AFTER = 2  # the server stops once this step's metrics were sent


@pytest.fixture
def run_sft(
    tiny_model_dir: Path,
    arithmetic_data: Path,
    mlflow_server: MlflowServer,
    capsys: pytest.CaptureFixture,
) -> Callable[[], dict[str, Any]]:
    """Runs ``llmrl sft`` (6 steps, logging to the server) in this process; returns its JSON
    summary line."""
    return sft_runner(capsys, tiny_model_dir, arithmetic_data, mlflow_server.uri, STEPS)


def test_server_back_mid_run_gets_every_step_once(
    run_sft: Callable[[], dict[str, Any]],
    mlflow_server: MlflowServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spool_dir = tmp_path / "spool"
    during: dict[str, set] = {}

    def come_back() -> None:
        during["spooled"] = spooled(spool_dir)
        mlflow_server.start()

    tap = MetricsTap({STOP_AFTER: mlflow_server.stop, 4: come_back})
    tap.install(monkeypatch)
    summary = run_sft()

    assert summary["step"] == STEPS and sorted(tap.logged) == list(range(1, STEPS + 1))
    assert {("loss", 3), ("loss", 4)} <= during["spooled"], "steps 3-4 waited in the spool"
    assert ("loss", STOP_AFTER) not in during["spooled"]
    assert summary["tracking_spool"] == []
    assert list(spool_dir.glob("*.jsonl")) == []
    run_id = run_id_of(summary["final_checkpoint"])
    assert_every_step_once(mlflow_server.uri, run_id, tap.logged)
    from mlflow import MlflowClient

    assert MlflowClient(mlflow_server.uri).get_run(run_id).info.status == "FINISHED"


def test_server_gone_for_good_leaves_a_named_spool_with_every_missing_metric(
    run_sft: Callable[[], dict[str, Any]],
    mlflow_server: MlflowServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tap = MetricsTap({STOP_AFTER: mlflow_server.stop})
    tap.install(monkeypatch)
    summary = run_sft()
    assert mlflow_server.proc.poll() is not None, "the server stayed away to the end"
    assert summary["step"] == STEPS and sorted(tap.logged) == list(range(1, STEPS + 1))

    (spool_file,) = summary["tracking_spool"]
    spool_file = Path(spool_file)
    assert spool_file.parent == tmp_path / "spool" and spool_file.suffix == ".jsonl"
    missing = {(k, s) for s, metrics in tap.logged.items() if s > STOP_AFTER for k in metrics}
    assert spooled(spool_file.parent) == missing
    run_id = run_id_of(summary["final_checkpoint"])
    assert spool_file.name == f"{run_id}.jsonl"

    mlflow_server.start()
    assert flush_spool(spool_file.parent, mlflow_server.uri) == len(missing)
    assert not spool_file.exists()
    assert_every_step_once(mlflow_server.uri, run_id, tap.logged)
    from mlflow import MlflowClient

    assert MlflowClient(mlflow_server.uri).get_run(run_id).info.status == "FINISHED"
