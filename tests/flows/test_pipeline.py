"""The pipeline flow under Prefect's test harness, with real stages on a tiny random model.

One module-scoped run of the whole pipeline (prepare 20/10 rows, SFT 2 steps, GRPO 2 steps of
2 prompts x 2 samples, 8 new tokens, evaluation on 5 rows) is shared by the tests that inspect
it; then a second run with the same parameters must skip every stage, and a run with an invalid
SFT override must fail with the stage's own message and no retry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flows.launchers import StageConfigError, TransientStageError
from flows.pipeline import RUN_ORDER, PipelineParams, StageCall, pipeline, run_stage
from tests.flows.prefect_harness import FlakyLauncher

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EVALUATED = ("eval-base", "eval-sft", "eval-grpo")
CHILD_RUNS = {"sft", "grpo", *EVALUATED}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny, tokenizer) -> Path:
    """The tiny random Llama and SmolLM2's tokenizer, saved as a model directory."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def params(tmp_path_factory, tiny_dir: Path) -> PipelineParams:
    root = tmp_path_factory.mktemp("pipeline")
    model = f"model.name={tiny_dir}"
    return PipelineParams(
        prepare_config=str(REPO / "configs/prepare.yaml"),
        sft_config=str(REPO / "configs/sft.yaml"),
        grpo_config=str(REPO / "configs/grpo.yaml"),
        eval_config=str(REPO / "configs/eval.yaml"),
        work_dir=str(root / "work"),
        mlflow_tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
        experiment="flow-test",
        overrides={
            "prepare": ["generate.train_size=20", "generate.eval_size=10"],
            "sft": [model, "steps=2", "batch_size=2", "eval_every=1", "checkpoint.every=2"],
            "grpo": [
                model,
                "steps=2",
                "prompts_per_step=2",
                "num_samples=2",
                "generation.max_new_tokens=8",
                "checkpoint.every=2",
            ],
            "eval": [model, "max_new_tokens=8", "batch_size=5", "data.max_eval_rows=5"],
        },
        retry_delay_s=0,
    )


@pytest.fixture(scope="module")
def first_run(prefect_api, params: PipelineParams) -> Any:
    """The pipeline's first run: every stage runs."""
    return pipeline(params, return_state=True)


def _client() -> Any:
    from prefect import get_client

    return get_client(sync_client=True)


def _mlflow(params: PipelineParams) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(params.tracking_uri())


def _runs(params: PipelineParams) -> list[Any]:
    client = _mlflow(params)
    experiment = client.get_experiment_by_name(params.experiment)
    return client.search_runs([experiment.experiment_id], max_results=1000)


def _children(params: PipelineParams, parent_id: str) -> dict[str, Any]:
    return {
        run.info.run_name: run
        for run in _runs(params)
        if run.data.tags.get("mlflow.parentRunId") == parent_id
    }


def _filter(what: str, flow_run_id: Any, **extra: Any) -> list[dict[str, Any]]:
    """POST /<what>/filter by flow run. (Prefect 3.8's clients send `null` for filters left
    out, which its server rejects or turns into joins, so the request is written here.)"""
    body = {what: {"flow_run_id": {"any_": [str(flow_run_id)]}}, "limit": 200, "offset": 0}
    with _client() as client:
        return client.request("POST", f"/{what}/filter", json={**body, **extra}).json()


def _logs(flow_run_id: Any, text: str) -> list[str]:
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    logs = _filter("logs", flow_run_id, sort="TIMESTAMP_ASC")
    return [log["message"] for log in logs if text in log["message"]]


@pytest.mark.slow
def test_pipeline_completes_with_artifacts(first_run) -> None:
    assert first_run.is_completed(), first_run.message
    summary = first_run.result()
    assert [s["name"] for s in summary["stages"]] == list(RUN_ORDER)
    assert {s["status"] for s in summary["stages"]} == {"ran"}
    assert [row["model"] for row in summary["evaluation"]] == ["base", "sft", "grpo"]
    for row in summary["evaluation"]:
        assert 0.0 <= row["accuracy"] <= 1.0
        assert row["num_problems"] == 5
    flow_run_id = first_run.state_details.flow_run_id
    artifacts = _filter("artifacts", flow_run_id, sort="CREATED_DESC")
    by_key = {a["key"]: a for a in artifacts}
    assert by_key["llmrl-pipeline-summary"]["type"] == "markdown"
    markdown = by_key["llmrl-pipeline-summary"]["data"]
    assert "| after GRPO |" in markdown and "| sft | ran |" in markdown
    table = by_key["llmrl-evaluation"]
    assert table["type"] == "table"
    assert [row["model"] for row in json.loads(table["data"])] == ["base", "sft", "grpo"]
    progress = by_key["llmrl-pipeline-progress"]
    assert progress["type"] == "progress"
    assert float(progress["data"]) == 100.0


@pytest.mark.slow
def test_every_stage_nests_its_mlflow_run_under_the_parent(first_run, params) -> None:
    summary = first_run.result()
    parent_id = summary["mlflow"]["parent_run_id"]
    parent = _mlflow(params).get_run(parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["prefect.flow_run_id"] == str(first_run.state_details.flow_run_id)
    assert {"accuracy_base", "accuracy_sft", "accuracy_grpo", "seconds_sft"} <= set(
        parent.data.metrics
    )
    children = _children(params, parent_id)
    assert set(children) == CHILD_RUNS
    assert "loss" in children["sft"].data.metrics
    assert children["grpo"].data.metrics  # reward, loss, timings...
    for name in EVALUATED:
        assert "accuracy" in children[name].data.metrics
    stages = {s["name"]: s for s in summary["stages"]}
    assert stages["sft"]["mlflow_run_id"] == children["sft"].info.run_id
    # Artifacts (checkpoints, samples) stay beside the SQLite store, not in the working dir.
    store = Path(params.tracking_uri().removeprefix("sqlite:///")).parent
    assert children["sft"].info.artifact_uri.startswith(str(store / "mlruns" / "flow-test"))


@pytest.mark.slow
def test_a_second_run_skips_finished_stages(first_run, params) -> None:
    assert first_run.is_completed()
    runs_before = len(_runs(params))
    second = pipeline(params, return_state=True)
    assert second.is_completed(), second.message
    summary = second.result()
    assert {s["status"] for s in summary["stages"]} == {"skipped"}
    assert summary["evaluation"] == first_run.result()["evaluation"]
    # Only the new parent run: no stage ran, so no child run was created.
    assert len(_runs(params)) == runs_before + 1
    assert _children(params, summary["mlflow"]["parent_run_id"]) == {}
    skipped = _logs(second.state_details.flow_run_id, "finished in a previous run")
    assert {message.split(":")[0] for message in skipped} == {
        f"skipping {name}" for name in RUN_ORDER
    }
    store = Path(params.work_dir) / "stages"
    assert len(list(store.glob("*.json"))) == len(RUN_ORDER)


@pytest.mark.slow
def test_an_invalid_stage_config_fails_the_flow_with_its_message(first_run, params) -> None:
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterName,
    )
    from prefect.client.schemas.sorting import TaskRunSort

    broken = params.model_copy(
        update={"overrides": {**params.overrides, "sft": ["optimizer.lr=-1", "steps=3"]}}
    )
    state = pipeline(broken, return_state=True)
    assert state.is_failed()
    error = state.result(raise_on_failure=False)
    assert isinstance(error, StageConfigError)
    assert "optimizer.lr" in str(error)
    assert "greater than 0" in str(error)
    with _client() as client:
        (task_run,) = client.read_task_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
            ),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=["sft"])),
            sort=TaskRunSort.ID_DESC,
            limit=10,
        )
    assert task_run.run_count == 1  # a config error is not retried
    parents = [r for r in _runs(params) if r.data.tags.get("prefect.flow_run_id") == str(
        state.state_details.flow_run_id
    )]  # fmt: skip
    assert [p.info.status for p in parents] == ["FAILED"]


def _run_stage_in_a_flow(launcher: FlakyLauncher, store: Path) -> Any:
    from prefect import flow

    call = StageCall("eval-base", "eval", None, (), "k1", str(store))

    @flow(name="stage-retry-test")
    def one_stage() -> dict:
        return run_stage.with_options(retries=2, retry_delay_seconds=0)(call, launcher, {}, None)

    return one_stage(return_state=True)


def test_transient_failures_are_retried(prefect_api, tmp_path: Path) -> None:
    launcher = FlakyLauncher(TransientStageError("eval-base", "API answered 503"), failures=2)
    state = _run_stage_in_a_flow(launcher, tmp_path)
    assert state.is_completed()
    assert launcher.calls == 3
    assert state.result()["summary"] == {"accuracy": 0.5, "num_problems": 4}
    assert (tmp_path / "eval-base-k1.json").is_file()


def test_config_errors_are_not_retried(prefect_api, tmp_path: Path) -> None:
    launcher = FlakyLauncher(StageConfigError("eval-base", "label: bad"), failures=5)
    state = _run_stage_in_a_flow(launcher, tmp_path)
    assert state.is_failed()
    assert launcher.calls == 1
    assert isinstance(state.result(raise_on_failure=False), StageConfigError)
    assert not (tmp_path / "eval-base-k1.json").exists()
