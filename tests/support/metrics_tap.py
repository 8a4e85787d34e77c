"""A tracking outage in the middle of a real (tiny-model) SFT stage, and what to check after it:
the stage's metrics tapped per step with an event at given steps (stop a server, start it), the
spool read back, and every step's metrics in MLflow exactly once
(``tests/reliability/test_tracking_faults.py`` on SQLite, ``tests/services`` on PostgreSQL)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmrl.cli import main
from llmrl.tracking import Tracker
from tests.support.mlflow_runs import metric_steps


class MetricsTap:
    """Records what the SFT stage logs per step, and runs ``events[step]()`` once the tracker
    has handled that step's metrics (sent, or spooled)."""

    def __init__(self, events: dict[int, Callable[[], None]]) -> None:
        self.events = events
        self.logged: dict[int, dict[str, float]] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        log_metrics = Tracker.log_metrics

        def tapped(tracker: Tracker, metrics: dict[str, float], step: int) -> None:
            log_metrics(tracker, metrics, step)
            if tracker.stage == "sft":
                self.logged[step] = dict(metrics)
                self.events.get(step, lambda: None)()

        monkeypatch.setattr(Tracker, "log_metrics", tapped)


def sft_runner(
    capsys: pytest.CaptureFixture, model_dir: Path, data: Path, tracking_uri: str, steps: int
) -> Callable[[], dict[str, Any]]:
    """Runs ``llmrl sft`` (``steps`` steps of batch 2 on ``model_dir``, logging to
    ``tracking_uri``) in this process when called; returns its JSON summary line."""
    sets = [
        f"model.name={model_dir}",
        f"data.path={data}",
        f"tracking.tracking_uri={tracking_uri}",
        f"steps={steps}",
        "batch_size=2",
        f"eval_every={steps}",
        f"checkpoint.every={steps}",
        "output_dir=sft",
    ]

    def run() -> dict[str, Any]:
        capsys.readouterr()
        code = main(["sft", "--no-progress", *(arg for s in sets for arg in ("--set", s))])
        out = capsys.readouterr().out
        assert code == 0, out
        return json.loads(out.strip().splitlines()[-1])

    return run


def spooled(spool_dir: Path) -> set[tuple[str, int]]:
    """``(key, step)`` of every metric record in the spool folder."""
    records = [
        json.loads(line)
        for path in spool_dir.glob("*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    return {(r["key"], r["step"]) for r in records}


def assert_every_step_once(uri: str, run_id: str, logged: dict[int, dict[str, float]]) -> None:
    """Every metric the stage logged is in the run, at each of its steps, exactly once."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    keys = {key for metrics in logged.values() for key in metrics}
    for key in keys:
        want = sorted(step for step, metrics in logged.items() if key in metrics)
        assert sorted(metric_steps(uri, run_id, key)) == want, key
    # MLflow stores the logged float as a float64: the same value (rel_tol=1e-6 allows a
    # float32 round trip, 6e-8)
    for m in client.get_metric_history(run_id, "loss"):
        assert math.isclose(m.value, logged[m.step]["loss"], rel_tol=1e-6)
