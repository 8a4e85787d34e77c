"""Tracker behaviour against a SQLite store, a real ``mlflow server`` and an unreachable one."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow import MlflowClient

from llmrl.tracking import Tracker, default_tracking_uri, flatten_params, flush_spool
from tests.support.mlflow_server import MlflowServer, free_port

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def steps_of(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


def tracker(uri: str, stage: str = "sft", **kwargs) -> Tracker:
    kwargs.setdefault("log_system_metrics", False)
    return Tracker(stage, tracking_uri=uri, **kwargs)


# ---------------------------------------------------------------- SQLite store


@dataclass
class LossCfg:
    clip_epsilon: float = 0.2
    kl_coef: float = 0.0


def test_params_flattened_stringified_truncated(sqlite_uri: str) -> None:
    with tracker(sqlite_uri) as t:
        t.log_params({"loss": LossCfg(), "optim": {"lr": 1e-5, "betas": [0.9, 0.95]}})
        t.log_params({"prompt": "x" * 7000, "odd key!": 1})
        run_id = t.run_id
    params = MlflowClient(sqlite_uri).get_run(run_id).data.params
    assert params["loss.clip_epsilon"] == "0.2"
    assert params["loss.kl_coef"] == "0.0"
    assert params["optim.lr"] == "1e-05"
    assert params["optim.betas"] == "[0.9, 0.95]"
    assert len(params["prompt"]) == 6000
    assert params["odd key_"] == "1"
    assert flatten_params({"a": {}, "b": None}) == {"a": "{}", "b": "None"}
    # NUL, which PostgreSQL's text columns refuse (tests/services), is written out; the escape
    # counts toward the limit
    assert flatten_params({"s": "a\x00b"}) == {"s": "a\\x00b"}
    assert flatten_params({"s": "x" * 5998 + "\x00"}) == {"s": "x" * 5998 + "\\x"}


def test_metrics_by_step_in_one_batch(sqlite_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    t = tracker(sqlite_uri)
    t.start()
    calls = []
    real = t._link.client.log_batch
    monkeypatch.setattr(
        t._link.client, "log_batch", lambda *a, **k: calls.append(k) or real(*a, **k)
    )
    for step in range(5):
        t.log_metrics({"loss": 1.0 / (step + 1), "reward/mean": float(step)}, step=step)
    t.finish()
    assert len(calls) == 5  # one request per call, both keys in it
    assert all(len(c["metrics"]) == 2 for c in calls)
    history = MlflowClient(sqlite_uri).get_metric_history(t.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(s, 1.0 / (s + 1)) for s in range(5)]
    assert steps_of(sqlite_uri, t.run_id, "reward/mean") == [0, 1, 2, 3, 4]
    assert t.last_step == 4
    assert MlflowClient(sqlite_uri).get_run(t.run_id).info.status == "FINISHED"


def test_nested_run_has_parent_tag(sqlite_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = tracker(sqlite_uri, "flow")
    parent.start()
    with tracker(sqlite_uri, "sft", parent_run_id=parent.run_id, tags={"model": "m"}) as child:
        child.log_metrics({"loss": 1.0}, step=0)
    monkeypatch.setenv("MLFLOW_PARENT_RUN_ID", parent.run_id)
    with tracker(sqlite_uri, "grpo") as from_env:
        pass
    parent.finish()
    client = MlflowClient(sqlite_uri)
    tags = client.get_run(child.run_id).data.tags
    assert tags["mlflow.parentRunId"] == parent.run_id
    assert tags["llmrl.stage"] == "sft"
    assert tags["model"] == "m"
    assert tags["mlflow.runName"] == "sft"
    assert client.get_run(from_env.run_id).data.tags["mlflow.parentRunId"] == parent.run_id
    assert "mlflow.parentRunId" not in client.get_run(parent.run_id).data.tags


def test_resume_logs_each_step_once(sqlite_uri: str) -> None:
    with tracker(sqlite_uri, tags={"attempt": 1}) as first:
        first.log_params({"lr": 0.1, "loss": {"clip_epsilon": 0.2}})
        for step in range(5):
            first.log_metrics({"loss": float(step)}, step=step)
    with tracker(sqlite_uri, run_id=first.run_id) as second:
        assert second.run_id == first.run_id
        assert second.last_step == 4
        for step in range(3, 8):
            second.log_metrics({"loss": 10.0 + step}, step=step)
        second.log_params({"lr": 0.1, "loss": {"clip_epsilon": 0.3}, "new": 1})
    assert second.stats["skipped_duplicate_steps"] == 2
    run = MlflowClient(sqlite_uri).get_run(first.run_id)
    history = MlflowClient(sqlite_uri).get_metric_history(first.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(8))
    assert {m.step: m.value for m in history}[4] == 4.0  # the first attempt's value stays
    assert run.data.params == {"lr": "0.1", "loss.clip_epsilon": "0.2", "new": "1"}
    assert run.data.tags["params_changed_on_resume"] == "loss.clip_epsilon"
    assert run.info.status == "FINISHED"


def test_nonfinite_values_skipped_and_counted(sqlite_uri: str) -> None:
    with tracker(sqlite_uri) as t:
        t.log_metrics({"loss": 1.0, "kl": math.nan}, step=0)
        t.log_metrics({"loss": math.inf, "kl": -math.inf}, step=1)
        t.log_metrics({"loss": 0.5, "kl": 0.1, "text": "n/a"}, step=2)
    assert t.stats["skipped_nonfinite"] == 3
    assert t.stats["skipped_invalid"] == 1
    assert steps_of(sqlite_uri, t.run_id, "loss") == [0, 2]
    assert steps_of(sqlite_uri, t.run_id, "kl") == [2]


def test_table_reward_curve_and_checkpoint_artifacts(sqlite_uri: str, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt-10"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights")
    rows = [{"prompt": "1+1?", "completion": "2", "reward": 1.0}, {"prompt": "2+2?", "x": [1]}]
    with tracker(sqlite_uri) as t:
        t.log_table(rows, "generations", step=3)
        t.log_reward_curve({"reward/mean": [(0, 0.1), (1, 0.4), (2, 0.6)], "reward/std": []})
        t.log_checkpoint(ckpt, step=10)
    with tracker(sqlite_uri, log_checkpoint_files=False) as tags_only:
        tags_only.log_checkpoint(ckpt, step=20)
    client = MlflowClient(sqlite_uri)
    table = Path(client.download_artifacts(t.run_id, "samples/generations_step000003.json"))
    data = json.loads(table.read_text())
    assert data["columns"] == ["prompt", "completion", "reward", "x"]
    assert data["data"][0][:2] == ["1+1?", "2"]
    png = Path(client.download_artifacts(t.run_id, "reward_curve.png"))
    assert png.read_bytes()[:8] == PNG_MAGIC
    run = client.get_run(t.run_id)
    assert run.data.tags["checkpoint.step-000010"] == str(ckpt.resolve())
    listed = [a.path for a in client.list_artifacts(t.run_id, "checkpoints/step-000010")]
    assert listed == ["checkpoints/step-000010/model.safetensors"]
    assert client.get_run(tags_only.run_id).data.tags["checkpoint.step-000020"] == str(ckpt)
    assert client.list_artifacts(tags_only.run_id, "checkpoints") == []


def test_system_metrics_when_psutil(sqlite_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("psutil")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    with Tracker("sft", tracking_uri=sqlite_uri) as t:  # log_system_metrics=None: automatic
        t.log_metrics({"loss": 1.0}, step=0)
        time.sleep(1.0)
    metrics = MlflowClient(sqlite_uri).get_run(t.run_id).data.metrics
    assert any(k.startswith("system/") for k in metrics)


def test_disabled_tracker_is_a_noop(tmp_path: Path) -> None:
    t = Tracker("sft", enabled=False, spool_dir=tmp_path / "spool")
    with t:
        assert t.start() is None
        t.log_params({"a": 1})
        t.log_metrics({"loss": 1.0}, step=0)
        t.log_table([{"a": 1}], "g", step=0)
        t.log_artifact(tmp_path)
        t.log_checkpoint(tmp_path, step=0)
        t.log_reward_curve({"r": [(0, 1.0)]})
        t.set_tags({"a": "b"})
    assert t.run_id is None
    assert t.spooled == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # no db, no spool


def test_import_llmrl_does_not_import_mlflow() -> None:
    code = "import sys, llmrl, llmrl.tracking; sys.exit('mlflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_default_tracking_uri(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert default_tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert default_tracking_uri() == "http://mlflow:5000"


# ---------------------------------------------------------------- unreachable and real server


def test_unreachable_at_start_spools_then_flush_spool_replays(
    sqlite_uri: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spool_dir = tmp_path / "spool"
    caplog.set_level(logging.WARNING, logger="llmrl.tracking")
    t = tracker(uri, spool_dir=spool_dir, retry_interval_s=0.05, finish_attempts=2)
    assert t.start() is None
    assert any(uri in r.getMessage() for r in caplog.records)
    t.log_params({"lr": 0.1})
    for step in range(3):
        t.log_metrics({"loss": float(step)}, step=step)
    t.set_tags({"note": "offline"})
    t.log_table([{"prompt": "p", "reward": 1.0}], "generations", step=2)
    assert t.spooled == 3
    t.finish()  # still unreachable: the spool stays, with the final status
    assert any("flush_spool" in r.getMessage() for r in caplog.records)
    lines = [json.loads(x) for x in next(spool_dir.glob("*.jsonl")).read_text().splitlines()]
    assert [(r["key"], r["step"], r["value"]) for r in lines] == [("loss", s, s) for s in range(3)]
    assert set(lines[0]) == {"run_id", "key", "value", "step", "timestamp"}

    assert flush_spool(spool_dir, sqlite_uri) == 3  # the run is created on replay
    assert list(spool_dir.iterdir()) == []
    client = MlflowClient(sqlite_uri)
    (run,) = client.search_runs(
        [client.get_experiment_by_name("llmrl").experiment_id], "tags.note = 'offline'"
    )
    assert steps_of(sqlite_uri, run.info.run_id, "loss") == [0, 1, 2]
    assert run.data.params == {"lr": "0.1"}
    assert run.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(run.info.run_id, "samples")] == [
        "samples/generations_step000002.json"
    ]


def test_resume_while_unreachable_replays_each_step_once(sqlite_uri: str, tmp_path: Path) -> None:
    with tracker(sqlite_uri) as first:
        for step in range(5):
            first.log_metrics({"loss": float(step)}, step=step)
    offline = f"http://127.0.0.1:{free_port()}"
    spool_dir = tmp_path / "spool"
    t = tracker(offline, run_id=first.run_id, spool_dir=spool_dir, finish_attempts=1)
    assert t.start() == first.run_id  # the id is known, the steps are not
    for step in range(3, 8):
        t.log_metrics({"loss": 10.0 + step}, step=step)
    t.finish("FAILED")
    assert (spool_dir / f"{first.run_id}.jsonl").exists()
    assert flush_spool(spool_dir, sqlite_uri) == 3  # steps 3 and 4 were already in the run
    history = MlflowClient(sqlite_uri).get_metric_history(first.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(8))
    assert MlflowClient(sqlite_uri).get_run(first.run_id).info.status == "FAILED"


@pytest.mark.integration
def test_http_server_roundtrip(mlflow_server: MlflowServer) -> None:
    with tracker(mlflow_server.uri) as t:
        t.log_params({"loss": {"clip_epsilon": 0.2}})
        for step in range(3):
            t.log_metrics({"loss": 1.0 - step / 10}, step=step)
        t.log_table([{"prompt": "p", "completion": "c"}], "generations", step=2)
    client = MlflowClient(mlflow_server.uri)
    history = client.get_metric_history(t.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.9), (2, 0.8)]
    run = client.get_run(t.run_id)
    assert run.data.params == {"loss.clip_epsilon": "0.2"}
    assert run.info.status == "FINISHED"
    assert client.list_artifacts(t.run_id, "samples")[0].path.endswith("_step000002.json")


@pytest.mark.integration
def test_server_outage_spools_and_finish_replays(
    mlflow_server: MlflowServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="llmrl.tracking")
    spool_dir = tmp_path / "spool"
    t = tracker(mlflow_server.uri, spool_dir=spool_dir, retry_interval_s=1.0, finish_attempts=10)
    t.start()
    for step in range(3):
        t.log_metrics({"loss": float(step), "reward": 0.1 * step}, step=step)
    mlflow_server.stop()
    t0 = time.monotonic()
    for step in range(3, 8):  # must not raise, must not wait on the dead server each step
        t.log_metrics({"loss": float(step), "reward": 0.1 * step}, step=step)
    during_outage = time.monotonic() - t0
    t.set_tags({"outage": "yes"})
    assert t.spooled > 0
    assert during_outage < 30
    assert any(mlflow_server.uri in r.getMessage() for r in caplog.records)
    mlflow_server.start()  # same port, same store
    time.sleep(1.0)  # past the retry interval: the next call replays the spool first
    t.log_metrics({"loss": 8.0, "reward": 0.8}, step=8)
    replayed_by_logging = t.spooled == 0
    t.finish()
    assert replayed_by_logging
    assert t.spooled == 0
    assert t.stats["spool_flushes"] == 1
    assert not spool_dir.exists() or list(spool_dir.iterdir()) == []
    client = MlflowClient(mlflow_server.uri)
    for key in ("loss", "reward"):
        assert steps_of(mlflow_server.uri, t.run_id, key) == list(range(9))
    run = client.get_run(t.run_id)
    assert run.data.tags["outage"] == "yes"
    assert run.info.status == "FINISHED"
    starts = [round(x, 1) for x in mlflow_server.start_seconds]
    print(f"5 calls during the outage: {during_outage:.3f} s; server starts: {starts} s")
