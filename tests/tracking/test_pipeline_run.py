"""`PipelineRun`, the flow's parent run: opened, tagged, found children, closed, through the one
client policy (fails fast on a dead server, never changes the process environment)."""

from __future__ import annotations

import os
import time

import pytest
from mlflow import MlflowClient

from llmrl.tracking import PipelineRun, Tracker, TrackingUnavailableError
from llmrl.tracking.experiments import EXPERIMENT_KIND_TAG
from tests.support.mlflow_server import MlflowServer, free_port


def _open(uri: str, experiment: str = "parent-test", **kwargs) -> PipelineRun:
    return PipelineRun.open(
        uri,
        experiment,
        run_name="pipeline-x",
        tags={"prefect.flow_run_id": "fr-1"},
        params={"overrides": {"sft": ["steps=2"]}, "skip": []},
        **kwargs,
    )


def _lifecycle(uri: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Open, nest a stage run under it, find it, tag, close; the flow's calls leave the
    environment untouched."""
    before = dict(os.environ)
    parent = _open(uri)
    assert dict(os.environ) == before
    client = MlflowClient(uri)
    run = client.get_run(parent.run_id)
    assert run.info.run_name == "pipeline-x"
    assert run.data.tags["llmrl.stage"] == "pipeline"
    assert run.data.tags["prefect.flow_run_id"] == "fr-1"
    assert run.data.params["overrides.sft"] == "['steps=2']"
    assert client.get_experiment(parent.experiment_id).tags[EXPERIMENT_KIND_TAG]

    env = parent.stage_env(tmp_path / "spool")
    assert env["MLFLOW_PARENT_RUN_ID"] == parent.run_id
    assert env["LLMRL_MLFLOW_SPOOL"] == str((tmp_path / "spool").resolve())
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with Tracker("sft", experiment="parent-test", log_system_metrics=False) as stage:
        pass  # a stage process (here: this one) applies the client policy to its environment
    for key in [*env, "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"]:
        monkeypatch.delenv(key, raising=False)
    assert parent.find_child("sft") == stage.run_id
    assert parent.find_child("grpo") is None

    parent.set_tags({"llmrl.run.sft": stage.run_id})
    parent.close("FINISHED", {"accuracy_sft": 0.25})
    run = client.get_run(parent.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {"accuracy_sft": 0.25}
    assert run.data.tags["llmrl.run.sft"] == stage.run_id
    assert dict(os.environ) == before


def test_parent_run_on_sqlite(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    _lifecycle(uri, monkeypatch, tmp_path)
    parent = _open(uri)
    assert parent.ui_url == "http://127.0.0.1:5000"
    assert parent.link(parent.run_id) == (
        f"http://127.0.0.1:5000/#/experiments/{parent.experiment_id}/runs/{parent.run_id}"
        "?workflowType=machine_learning"
    )
    assert parent.runs_link() == (
        f"http://127.0.0.1:5000/#/experiments/{parent.experiment_id}/runs"
        "?workflowType=machine_learning"
    )
    assert parent.link(None) is None
    monkeypatch.setenv("LLMRL_MLFLOW_UI_URL", "https://mlflow.example.org/")
    assert _open(uri).ui_url == "https://mlflow.example.org"
    assert _open(uri, ui_url="http://given:1").ui_url == "http://given:1"


def test_parent_run_stores_text_and_json_artifacts(tmp_path) -> None:
    import json

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = _open(uri)
    parent.log_text("# summary\n", "pipeline_summary.md")
    parent.log_dict({"gains": [{"gain": 0.25, "ci_low": None}]}, "evaluation.json")
    client = MlflowClient(uri)
    files = {item.path for item in client.list_artifacts(parent.run_id)}
    assert files == {"pipeline_summary.md", "evaluation.json"}
    folder = client.download_artifacts(parent.run_id, "", str(tmp_path / "got"))
    assert (tmp_path / "got" / "pipeline_summary.md").read_text() == "# summary\n"
    stored = json.loads((tmp_path / "got" / "evaluation.json").read_text())
    assert stored == {"gains": [{"gain": 0.25, "ci_low": None}]} and folder


def test_parent_run_on_a_server(
    mlflow_server: MlflowServer, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    _lifecycle(mlflow_server.uri, monkeypatch, tmp_path)
    assert _open(mlflow_server.uri).ui_url == mlflow_server.uri


def test_a_dead_server_fails_fast_without_touching_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")
    before = dict(os.environ)
    uri = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(TrackingUnavailableError, match=f"MLflow at {uri} is unreachable"):
        _open(uri)
    assert time.monotonic() - started < 5
    parent = PipelineRun(uri, "e", "1", "r", uri)
    with pytest.raises(TrackingUnavailableError):
        parent.close("FAILED")
    assert dict(os.environ) == before
