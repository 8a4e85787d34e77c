"""The pipeline flow under Prefect's test harness, with real stages on a tiny random model.

One module-scoped run of the whole pipeline (prepare 20/10 rows, SFT 2 steps, GRPO 2 steps of
2 prompts x 2 samples, 8 new tokens, evaluation on 5 rows) is shared by the tests that inspect
it; then a second run with the same parameters must skip every stage, and a run with an invalid
SFT override must fail with the stage's own message and no retry.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from flows.launchers import StageConfigError, TransientStageError
from flows.pipeline import RUN_ORDER, PipelineParams, StageCall, pipeline, run_stage
from tests.support.pipeline_runs import (
    CHILD_RUNS,
    EVALUATED,
    TRAINED,
    assert_dataset_inputs,
    assert_registered_models,
    child_runs,
    short_overrides,
)
from tests.support.prefect_harness import FlakyLauncher, filter_by_flow_run, prefect_client

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


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
    return PipelineParams(
        prepare_config=str(REPO / "configs/prepare.yaml"),
        sft_config=str(REPO / "configs/sft.yaml"),
        grpo_config=str(REPO / "configs/grpo.yaml"),
        eval_config=str(REPO / "configs/eval.yaml"),
        work_dir=str(root / "work"),
        mlflow_tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
        experiment="flow-test",
        overrides=short_overrides(tiny_dir),
        retry_delay_s=0,
    )


@pytest.fixture(scope="module")
def first_run(prefect_api, params: PipelineParams) -> Any:
    """The pipeline's first run: every stage runs."""
    return pipeline(params, return_state=True)


def _mlflow(params: PipelineParams) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(params.tracking_uri())


def _runs(params: PipelineParams) -> list[Any]:
    client = _mlflow(params)
    experiment = client.get_experiment_by_name(params.experiment)
    return client.search_runs([experiment.experiment_id], max_results=1000)


def _children(params: PipelineParams, parent_id: str) -> dict[str, Any]:
    return child_runs(_mlflow(params), params.experiment, parent_id)


def _logs(flow_run_id: Any, text: str) -> list[str]:
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    logs = filter_by_flow_run("logs", flow_run_id, sort="TIMESTAMP_ASC")
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
        assert sum(c["total"] for c in row["accuracy_by_kind"].values()) == 5
        assert set(row["accuracy_by_kind"]) <= {"+", "-", "*"}  # the operators of each problem
    gains = {(g["after"], g["before"]): g for g in summary["gains"]}
    assert list(gains) == [("sft", "base"), ("grpo", "sft"), ("grpo", "base")]
    for gain in gains.values():  # paired over the same 5 problems
        assert gain["note"] is None and gain["num_problems"] == 5
        assert gain["ci_low"] <= gain["gain"] <= gain["ci_high"] and 0.0 < gain["p_value"] <= 1.0
    flow_run_id = first_run.state_details.flow_run_id
    artifacts = filter_by_flow_run("artifacts", flow_run_id, sort="CREATED_DESC")
    by_key = {a["key"]: a for a in artifacts}
    assert by_key["llmrl-pipeline-summary"]["type"] == "markdown"
    markdown = by_key["llmrl-pipeline-summary"]["data"]
    assert "| after GRPO |" in markdown and "| sft | ran |" in markdown
    assert "| gain vs previous [95% CI] | McNemar p |" in markdown
    table = by_key["llmrl-evaluation"]
    assert table["type"] == "table"
    rows = json.loads(table["data"])
    assert [row["model"] for row in rows] == ["base", "sft", "grpo"]
    assert (
        rows[0]["gain vs previous [95% CI]"] == "-" and "[" in rows[2]["gain vs previous [95% CI]"]
    )
    progress = by_key["llmrl-pipeline-progress"]
    assert progress["type"] == "progress"
    assert float(progress["data"]) == 100.0
    link = summary["mlflow"]["parent_link"]
    assert link.startswith("http://127.0.0.1:5000/#/experiments/")
    assert by_key["llmrl-mlflow-run"]["data"] == (
        f"[MLflow run {summary['mlflow']['parent_run_id']} (experiment flow-test)]({link})"
    )


@pytest.mark.slow
def test_flow_run_is_named_and_tagged_from_its_configs(first_run, tiny_dir: Path) -> None:
    with prefect_client() as client:
        run = client.read_flow_run(first_run.state_details.flow_run_id)
        task_runs = filter_by_flow_run("task_runs", run.id)
    assert re.fullmatch(rf"{tiny_dir.name}-arithmetic-\d{{8}}-\d{{4}}", run.name), run.name
    tags = {f"model:{tiny_dir.name}", "task:arithmetic", "launcher:local"}
    assert tags <= set(run.tags)
    stage_runs = [t for t in task_runs if t["name"] in RUN_ORDER]
    assert len(stage_runs) == len(RUN_ORDER)
    assert all(tags <= set(t["tags"]) for t in stage_runs)


@pytest.mark.slow
def test_every_stage_nests_its_mlflow_run_under_the_parent(first_run, params) -> None:
    summary = first_run.result()
    parent_id = summary["mlflow"]["parent_run_id"]
    client = _mlflow(params)
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED"
    flow_run_id = str(first_run.state_details.flow_run_id)
    assert parent.data.tags["prefect.flow_run_id"] == flow_run_id
    assert parent.data.tags["prefect.flow_run_url"].endswith(f"/runs/flow-run/{flow_run_id}")
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert {"accuracy_base", "accuracy_sft", "accuracy_grpo", "seconds_sft"} <= set(
        parent.data.metrics
    )
    for gain in ("sft_over_base", "grpo_over_sft", "grpo_over_base"):
        for suffix in ("", "_ci_low", "_ci_high", "_p_mcnemar"):
            key = f"gain/{gain}{suffix}"
            # the same float64 through MLflow: equal (approx's default rel=1e-6)
            assert parent.data.metrics[key] == pytest.approx(summary["metrics"][key])
    artifacts = {item.path for item in client.list_artifacts(parent_id)}
    assert {"pipeline_summary.md", "evaluation.json"} <= artifacts
    children = _children(params, parent_id)
    assert set(children) == CHILD_RUNS
    assert "loss" in children["sft"].data.metrics
    assert children["grpo"].data.metrics  # reward, loss, timings...
    for name in EVALUATED:
        assert "accuracy" in children[name].data.metrics
        by_kind = [k for k in children[name].data.metrics if k.startswith("accuracy_by_kind/")]
        assert by_kind and set(by_kind) <= {f"accuracy_by_kind/{k}" for k in ("add", "sub", "mul")}
    stages = {s["name"]: s for s in summary["stages"]}
    for name, child in children.items():
        assert stages[name]["mlflow_run_id"] == child.info.run_id
        assert parent.data.tags[f"llmrl.run.{name}"] == child.info.run_id
    # Artifacts (checkpoints, samples) stay beside the SQLite store, not in the working dir.
    store = Path(params.tracking_uri().removeprefix("sqlite:///")).parent
    assert children["sft"].info.artifact_uri.startswith(str(store / "mlruns" / "flow-test"))


@pytest.mark.slow
def test_stage_runs_log_their_datasets_and_register_their_final_models(first_run, params) -> None:
    summary = first_run.result()
    children = _children(params, summary["mlflow"]["parent_run_id"])
    dataset = Path(summary["stages"][0]["summary"]["path"])
    assert_dataset_inputs(_mlflow(params), children, dataset)
    checkpoints = {
        name: Path(summary["stages"][RUN_ORDER.index(name)]["summary"]["final_checkpoint"])
        for name in TRAINED
    }
    assert_registered_models(_mlflow(params), children, params.experiment, checkpoints)


@pytest.mark.slow
def test_a_second_run_skips_finished_stages(first_run, params) -> None:
    assert first_run.is_completed()
    runs_before = len(_runs(params))
    second = pipeline(params, return_state=True)
    assert second.is_completed(), second.message
    summary = second.result()
    assert {s["status"] for s in summary["stages"]} == {"skipped"}
    assert summary["evaluation"] == first_run.result()["evaluation"]
    # Only the new parent run: no stage ran, so no child run was created; the parent names
    # the runs its reused results came from, and no model version was added.
    assert len(_runs(params)) == runs_before + 1
    assert _children(params, summary["mlflow"]["parent_run_id"]) == {}
    parent = _mlflow(params).get_run(summary["mlflow"]["parent_run_id"])
    first_stages = first_run.result()["stages"]
    assert {name: parent.data.tags[f"llmrl.run.{name}"] for name in RUN_ORDER} == {
        s["name"]: s["mlflow_run_id"] for s in first_stages
    }
    for name in TRAINED:
        assert len(_mlflow(params).search_model_versions(f"name = 'flow-test-{name}'")) == 1
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
    with prefect_client() as client:
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
