"""llmrl's tracker against the chart's MLflow server on a real PostgreSQL
(``tests/services/conftest.py`` starts both from the chart's render and the guide's Secrets).

Where PostgreSQL and SQLite part ways:

- connection loss: PostgreSQL stops (``pg_ctl -m fast`` cuts every connection) in the middle of
  a tiny SFT stage and comes back two steps later; the server answers 503 meanwhile, the tracker
  spools, replays, and every step's metrics are in MLflow, and in PostgreSQL's ``metrics`` table,
  exactly once. The same with the MLflow server restarted instead (a start on an existing,
  migrated database);
- concurrent writers: stage processes open their runs under one parent, log and register
  versions of one model at the same moment, through the chart's server (4 uvicorn workers,
  separate transactions): no lost or doubled row, versions 1..N;
- value limits PostgreSQL enforces and SQLite does not (``VARCHAR`` lengths, NUL characters).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from tests.support.metrics_tap import MetricsTap, assert_every_step_once, sft_runner, spooled
from tests.support.paths import REPO
from tests.support.postgres import PostgresCluster
from tests.support.service_process import ServiceProcess
from tests.support.stages import run_id_of
from tests.support.tracking_writer import metrics_of

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("isolated_stage")]

STEPS = 6
STOP_AFTER, BACK_AFTER = 2, 4  # the outage starts after this step's metrics, ends after that's
WRITERS, WRITER_STEPS = 4, 40
WRITERS_S = 300  # how long the writers may take, each of their requests included


@pytest.fixture
def run_sft(
    tiny_model_dir: Path,
    arithmetic_data: Path,
    mlflow_service: ServiceProcess,
    capsys: pytest.CaptureFixture,
) -> Callable[[], dict[str, Any]]:
    """``llmrl sft`` (6 steps) in this process, logging to the chart's server."""
    return sft_runner(capsys, tiny_model_dir, arithmetic_data, mlflow_service.url, STEPS)


def _rows(postgres: PostgresCluster, table: str, run_id: str, key: str) -> int:
    sql = f"SELECT count(*) FROM {table} WHERE run_uuid = '{run_id}' AND key = '{key}'"
    return int(postgres.psql(sql, "mlflow"))


def _outage_run(
    run_sft: Callable[[], dict[str, Any]],
    stop: Callable[[], None],
    start: Callable[[], None],
    spool_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[dict[str, Any], MetricsTap, set[tuple[str, int]]]:
    """The SFT stage with ``stop()`` after step 2's metrics and ``start()`` after step 4's;
    its summary, what it logged, and what the spool held just before ``start()``."""
    during: dict[str, set[tuple[str, int]]] = {}

    def come_back() -> None:
        during["spooled"] = spooled(spool_dir)
        start()

    tap = MetricsTap({STOP_AFTER: stop, BACK_AFTER: come_back})
    tap.install(monkeypatch)
    summary = run_sft()
    return summary, tap, during["spooled"]


def _assert_complete(
    summary: dict[str, Any],
    tap: MetricsTap,
    held: set[tuple[str, int]],
    uri: str,
    postgres: PostgresCluster,
    spool_dir: Path,
) -> None:
    assert summary["step"] == STEPS and sorted(tap.logged) == list(range(1, STEPS + 1))
    assert {("loss", 3), ("loss", 4)} <= held, "steps 3-4 waited in the spool"
    assert ("loss", STOP_AFTER) not in held
    assert summary["tracking_spool"] == [] and list(spool_dir.glob("*.jsonl")) == []
    run_id = run_id_of(summary["final_checkpoint"])
    assert_every_step_once(uri, run_id, tap.logged)
    assert _rows(postgres, "metrics", run_id, "loss") == STEPS  # no row doubled by a replay
    assert _rows(postgres, "latest_metrics", run_id, "loss") == 1
    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["steps"] == str(STEPS)


def test_a_database_restart_mid_run_loses_and_doubles_nothing(
    run_sft, mlflow_service, postgres, tmp_path, monkeypatch
) -> None:
    spool_dir = tmp_path / "spool"
    summary, tap, held = _outage_run(run_sft, postgres.stop, postgres.start, spool_dir, monkeypatch)
    assert mlflow_service.running, "the server stayed up through the database's outage"
    _assert_complete(summary, tap, held, mlflow_service.url, postgres, spool_dir)


def test_a_server_restart_mid_run_loses_and_doubles_nothing(
    run_sft, mlflow_service, postgres, tmp_path, monkeypatch
) -> None:
    spool_dir = tmp_path / "spool"
    starts = len(mlflow_service.start_seconds)
    summary, tap, held = _outage_run(
        run_sft, mlflow_service.stop, mlflow_service.start, spool_dir, monkeypatch
    )
    assert len(mlflow_service.start_seconds) == starts + 1  # started again on the same database
    _assert_complete(summary, tap, held, mlflow_service.url, postgres, spool_dir)


def _start_writers(
    uri: str, parent: str, folder: Path, model_dir: Path, registered: str
) -> list[subprocess.Popen]:
    start = folder / "start"
    # The database's concurrency is under test, not the stages' 5 s request timeout
    # (llmrl.tracking.client; tests/tracking and tests/reliability test it): in a full CI run
    # (vLLM's suite beside, 2 cores) a request took longer, and the writer spooled. The writers
    # wait for every answer as long as the test waits for them.
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_TIMEOUT": str(WRITERS_S)}
    procs = []
    for writer in range(WRITERS):
        argv = [
            sys.executable, "-m", "tests.support.tracking_writer", "--uri", uri,
            "--parent", parent, "--writer", str(writer), "--steps", str(WRITER_STEPS),
            "--start", str(start), "--model-dir", str(model_dir), "--registered", registered,
            "--spool", str(folder / f"spool-{writer}"),
        ]  # fmt: skip
        procs.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 120
    while len(list(folder.glob("start.ready-*"))) < WRITERS:  # every writer imported
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    start.write_text("go")  # every writer polls for it: their requests overlap
    return procs


def test_concurrent_writers_lose_and_double_nothing(
    mlflow_service: ServiceProcess, postgres: PostgresCluster, tmp_path: Path
) -> None:
    client = MlflowClient(mlflow_service.url)
    experiment = client.create_experiment("concurrent")
    parent = client.create_run(experiment, run_name="pipeline").info.run_id
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model_dir / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    procs = _start_writers(mlflow_service.url, parent, tmp_path, model_dir, "shared-model")
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=WRITERS_S)
        assert proc.returncode == 0, out
        results.append(json.loads(out.strip().splitlines()[-1]))

    assert [r["spooled"] for r in results] == [0] * WRITERS  # nothing waited: every call landed
    runs = {r["run_id"]: writer for writer, r in enumerate(results)}
    assert len(runs) == WRITERS
    infos = [client.get_run(run_id).info for run_id in runs]
    # the writes overlapped: every run was opened before any of them ended (by seconds: the
    # writers start together and each logs for longer than the others take to open their runs)
    assert max(i.start_time for i in infos) < min(i.end_time for i in infos)
    for run_id, writer in runs.items():
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent
        assert run.data.params == {"writer": str(writer), "optimizer.lr": str(1e-5 * (writer + 1))}
        for key in metrics_of(writer, 1):
            history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
            want = [(s, metrics_of(writer, s)[key]) for s in range(1, WRITER_STEPS + 1)]
            assert history == want, (writer, key)
    in_db = f"SELECT count(*) FROM metrics WHERE run_uuid IN ({','.join(map(repr, runs))})"
    assert int(postgres.psql(in_db.replace('"', "'"), "mlflow")) == WRITERS * WRITER_STEPS * 3
    versions = client.search_model_versions("name = 'shared-model'")
    assert sorted(int(v.version) for v in versions) == list(range(1, WRITERS + 1))
    assert {v.run_id for v in versions} == set(runs)
    assert sorted(r["version"] for r in results) == [
        f"shared-model/{n}" for n in range(1, WRITERS + 1)
    ]


def test_values_at_the_limits_postgres_enforces(
    mlflow_service: ServiceProcess, postgres: PostgresCluster, tmp_path: Path
) -> None:
    """Params are cut at 6000 characters and tags at 8000 by llmrl, the lengths of MLflow's
    ``VARCHAR`` columns, which PostgreSQL enforces (SQLite stores any length); NUL characters,
    which PostgreSQL refuses and SQLite stores, are written as ``\\x00``."""
    from llmrl.tracking import Tracker

    long_value = "é" * 7000  # characters, not bytes: VARCHAR(n) counts characters
    with Tracker(
        "limits", experiment="limits", tracking_uri=mlflow_service.url,
        spool_dir=tmp_path / "spool", log_system_metrics=False,
    ) as tracker:  # fmt: skip
        tracker.log_params({"prompt": long_value, "exact": "x" * 6000, "system": "a\x00b"})
        tracker.set_tags({"note": "y" * 9000, "nul": "\x00"})
        tracker.log_metrics({"loss": 0.5}, step=1)
    run_id = tracker.run_id
    run = MlflowClient(mlflow_service.url).get_run(run_id)
    assert run.data.params["prompt"] == "é" * 6000
    assert run.data.params["exact"] == "x" * 6000
    assert run.data.tags["note"] == "y" * 8000
    # a NUL (PostgreSQL: "text fields cannot contain NUL", MLflow rejects the whole batch)
    # arrives written out, and the batch with it
    assert run.data.params["system"] == "a\\x00b" and run.data.tags["nul"] == "\\x00"
    stored = postgres.psql(
        f"SELECT key || ':' || char_length(value) FROM params WHERE run_uuid = '{run_id}' "
        "ORDER BY key",
        "mlflow",
    )
    assert stored.splitlines() == ["exact:6000", "prompt:6000", "system:6"]
    assert tracker.spooled == 0 and run.info.status == "FINISHED"


def test_the_database_holds_mlflow_s_newest_schema(
    mlflow_service: ServiceProcess, postgres: PostgresCluster
) -> None:
    """The chart's server migrated the empty ``mlflow`` database to the newest Alembic revision
    of the MLflow it runs (measured: ``dc11669786a5`` for MLflow 3.17.2), read from PostgreSQL."""
    import mlflow.store
    from alembic.script import ScriptDirectory

    migrations = Path(mlflow.store.__file__).parent / "db_migrations"
    head = ScriptDirectory(str(migrations)).get_current_head()
    assert mlflow_service.running
    assert postgres.psql("SELECT version_num FROM alembic_version", "mlflow").splitlines() == [head]
