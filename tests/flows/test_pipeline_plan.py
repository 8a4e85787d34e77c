"""The pipeline's pure parts: parameters, stage planning and keys, the store, the summary."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from flows.__main__ import build_parser, params_from_args
from flows.launchers import StageConfigError, StageFailedError, TransientStageError
from flows.pipeline import (
    RUN_ORDER,
    PipelineParams,
    StageStore,
    build_summary,
    given_result,
    plan_stage,
    render_markdown,
    retry_transient,
    stage_key,
)
from llmrl.tracking import PipelineRun

PREPARED = {"prepare": {"summary": {"path": "/data/arithmetic-1"}}}


@pytest.fixture
def params(tmp_path: Path) -> PipelineParams:
    configs = tmp_path / "configs"
    configs.mkdir()
    for stage in ("prepare", "sft", "grpo", "eval"):
        (configs / f"{stage}.yaml").write_text(f"# {stage}\nseed: 0\n", encoding="utf-8")
    return PipelineParams(
        prepare_config=str(configs / "prepare.yaml"),
        sft_config=str(configs / "sft.yaml"),
        grpo_config=str(configs / "grpo.yaml"),
        eval_config=str(configs / "eval.yaml"),
        work_dir=str(tmp_path / "work"),
        overrides={"sft": ["steps=3"], "evaluate": ["batch_size=2"]},
    )


def test_params_validate_stage_names_and_overrides() -> None:
    assert PipelineParams(skip=["evaluate"]).skip == ["eval"]
    assert PipelineParams(overrides={"evaluate": ["a=1"]}).overrides == {"eval": ["a=1"]}
    with pytest.raises(ValidationError, match="unknown stage 'train'"):
        PipelineParams(overrides={"train": ["steps=1"]})
    with pytest.raises(ValidationError, match="expected key=value"):
        PipelineParams(overrides={"sft": ["steps"]})
    with pytest.raises(ValidationError, match="unknown stages"):
        PipelineParams(skip=["rlhf"])
    with pytest.raises(ValidationError, match="only prepare, sft, grpo"):
        PipelineParams(start_from={"eval": "/x"})
    with pytest.raises(ValidationError, match="extra"):
        PipelineParams.model_validate({"stpes": 3})
    # The Prefect UI builds its form from this schema.
    schema = PipelineParams.model_json_schema()
    assert {"prepare_config", "overrides", "skip", "start_from", "launcher", "kubernetes"} <= set(
        schema["properties"]
    )


def test_which_stages_run() -> None:
    assert [n for n in RUN_ORDER if PipelineParams().runs(n)] == list(RUN_ORDER)
    skip_sft = PipelineParams(skip=["sft"])
    assert [n for n in RUN_ORDER if skip_sft.runs(n)] == [
        "prepare",
        "grpo",
        "eval-base",
        "eval-grpo",
    ]
    given = PipelineParams(skip=["sft"], start_from={"sft": "/ckpt"})
    assert not given.runs("sft") and given.runs("eval-sft")
    no_eval = PipelineParams(skip=["eval"])
    assert [n for n in RUN_ORDER if no_eval.runs(n)] == ["prepare", "sft", "grpo"]


def test_tracking_uri_defaults_to_an_absolute_sqlite_file(monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert PipelineParams().tracking_uri() == f"sqlite:///{Path('mlflow.db').resolve()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert PipelineParams().tracking_uri() == "http://mlflow:5000"
    assert PipelineParams(mlflow_tracking_uri="sqlite:////a/b.db").tracking_uri() == (
        "sqlite:////a/b.db"
    )


def test_plan_passes_upstream_results_and_puts_user_overrides_last(params) -> None:
    done = {**PREPARED, "sft": {"summary": {"final_checkpoint": "/ckpt/sft"}}}
    grpo = plan_stage(params, "grpo", done)
    work = Path(params.work_dir).resolve()
    assert grpo.stage == "grpo"
    assert grpo.overrides == (
        "data.path=/data/arithmetic-1",
        "model.checkpoint=/ckpt/sft",
        f"output_dir={work / f'grpo-{grpo.key}'}",
        "tracking.experiment=llmrl",
        "tracking.run_name=grpo",
    )
    evaluation = plan_stage(params, "eval-sft", done)
    assert evaluation.stage == "eval"
    assert evaluation.overrides[:3] == (
        "data.path=/data/arithmetic-1",
        "model.checkpoint=/ckpt/sft",
        "label=sft",
    )
    assert evaluation.overrides[-1] == "batch_size=2"  # the user's, last: they win
    base = plan_stage(params, "eval-base", done)
    assert not any(o.startswith("model.checkpoint") for o in base.overrides)
    assert plan_stage(params, "prepare", {}).overrides == (f"output_dir={work / 'data'}",)
    assert plan_stage(params, "sft", done).store_dir == str(work / "stages")


def test_the_key_changes_with_config_overrides_and_upstream(params, tmp_path) -> None:
    key = plan_stage(params, "sft", PREPARED).key
    assert plan_stage(params, "sft", PREPARED).key == key  # deterministic
    other_data = {"prepare": {"summary": {"path": "/data/arithmetic-2"}}}
    assert plan_stage(params, "sft", other_data).key != key
    changed = params.model_copy(update={"overrides": {"sft": ["steps=4"]}})
    assert plan_stage(changed, "sft", PREPARED).key != key
    Path(params.sft_config).write_text("seed: 1\n", encoding="utf-8")
    assert plan_stage(params, "sft", PREPARED).key != key
    # Tracking settings do not change results, so they do not change the key.
    renamed = params.model_copy(update={"experiment": "other"})
    assert plan_stage(renamed, "sft", PREPARED).key == plan_stage(params, "sft", PREPARED).key
    assert stage_key("a", "", [], {}) != stage_key("b", "", [], {})


def test_store_round_trip_is_atomic(tmp_path: Path) -> None:
    store = StageStore(tmp_path / "stages")
    assert store.load("sft", "k1") is None
    path = store.save("sft", "k1", {"summary": {"step": 2}})
    assert path == tmp_path / "stages" / "sft-k1.json"
    assert store.load("sft", "k1") == {"summary": {"step": 2}}
    assert list((tmp_path / "stages").iterdir()) == [path]  # no temporary left behind
    path.write_text("{truncated", encoding="utf-8")
    assert store.load("sft", "k1") is None  # a broken file means: run the stage again


def test_only_transient_errors_are_retried() -> None:
    def state(error: BaseException) -> SimpleNamespace:
        return SimpleNamespace(data=error)

    assert retry_transient(None, None, state(TransientStageError("sft", "503")))
    assert not retry_transient(None, None, state(StageConfigError("sft", "bad")))
    assert not retry_transient(None, None, state(StageFailedError("sft", "boom")))
    assert not retry_transient(None, None, state(ValueError("bug")))


def test_summary_and_markdown() -> None:
    tracking = PipelineRun(
        "sqlite:////x/mlflow.db", "llmrl", "1", "parent123", "http://127.0.0.1:5000"
    )
    records = {
        "prepare": {"summary": {"path": "/d"}, "seconds": 2.0, "status": "ran"},
        "sft": {
            "summary": {"step": 20, "train_loss": 0.5, "final_checkpoint": "/c"},
            "seconds": 100.0,
            "status": "skipped",
            "mlflow_run_id": "child1",
        },
        "eval-base": {
            "summary": {"accuracy": 0.1, "num_problems": 40, "pass_at": {"1": 0.1}},
            "seconds": 30.0,
            "status": "ran",
        },
        "eval-sft": {"summary": {"accuracy": 0.3, "num_problems": 40}, "seconds": 31.0},
    }
    summary = build_summary(PipelineParams(), tracking, records, "run-x")
    assert [row["model"] for row in summary["evaluation"]] == ["base", "sft"]
    assert summary["evaluation"][0]["pass@1"] == 0.1
    assert summary["metrics"] == {
        "accuracy_base": 0.1,
        "accuracy_sft": 0.3,
        "gain/sft_over_base": pytest.approx(0.2),  # 0.3 - 0.1 in float64: 0.2 to 1 ulp
        "seconds_prepare": 2.0,
        "seconds_eval-base": 30.0,
        "seconds_eval-sft": 31.0,
    }
    markdown = render_markdown(summary)
    # No per-problem results in these records: the gain has no interval, and a note says why.
    assert "| after SFT | 0.300 | 40 | - | +0.200 (no CI) | - |" in markdown
    assert "- after SFT vs base model: no interval: no per-problem results" in markdown
    assert "skipped (finished in a previous run)" in markdown
    assert "http://127.0.0.1:5000/#/experiments/1/runs/child1" in markdown
    assert "train_loss 0.5" in markdown


def test_command_line_becomes_params() -> None:
    args = build_parser().parse_args(
        [
            "--config-dir",
            "my",
            "--steps-sft",
            "5",
            "--steps-grpo",
            "2",
            "--set",
            "eval.data.max_eval_rows=10",
            "--set",
            "sft.optimizer.lr=1e-5",
            "--skip",
            "eval-base",
        ]
    )
    params = params_from_args(args)
    assert params.sft_config == "my/sft.yaml"
    assert params.overrides == {
        "eval": ["data.max_eval_rows=10"],
        "sft": ["optimizer.lr=1e-5", "steps=5"],
        "grpo": ["steps=2"],
    }
    assert params.skip == ["eval-base"]
    with pytest.raises(SystemExit, match=r"STAGE\.KEY=VALUE"):
        params_from_args(build_parser().parse_args(["--set", "steps=5"]))


def test_start_from_replaces_a_stage_with_a_path(params, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt" / "model"
    checkpoint.mkdir(parents=True)
    record = given_result("sft", str(checkpoint))
    assert record["summary"] == {"final_checkpoint": str(checkpoint)}
    assert record["status"] == "given"
    grpo = plan_stage(params, "grpo", {**PREPARED, "sft": record})
    assert f"model.checkpoint={checkpoint}" in grpo.overrides
    assert given_result("prepare", str(tmp_path))["summary"] == {"path": str(tmp_path)}
    with pytest.raises(StageFailedError, match="does not exist"):
        given_result("grpo", str(tmp_path / "missing"))


def test_run_names_and_tags_come_from_configs_and_overrides(params, tmp_path: Path) -> None:
    Path(params.sft_config).write_text("model:\n  name: smollm2-135m-instruct\n", "utf-8")
    Path(params.prepare_config).write_text("task: arithmetic\n", "utf-8")
    assert params.setting("sft", "model.name") == "smollm2-135m-instruct"
    assert params.setting("sft", "steps") == 3  # the override, as YAML
    assert params.setting("grpo", "model.name") is None
    assert params.run_tags() == [
        "model:smollm2-135m-instruct",
        "task:arithmetic",
        "launcher:local",
    ]
    local = params.model_copy(
        update={
            "overrides": {"sft": ["model.name=/models/tiny-llama/"], "prepare": ["task=gsm8k"]},
            "launcher": "kubernetes",
        }
    )
    assert (local.model_label(), local.task_label()) == ("tiny-llama", "gsm8k")
    given = params.model_copy(update={"start_from": {"prepare": "/d/countdown-0123abcd"}})
    assert given.task_label() == "countdown"
    missing = PipelineParams(sft_config=str(tmp_path / "none.yaml"))
    assert (missing.model_label(), missing.setting("sft", "model.name")) == ("model", None)


def test_flow_run_url_uses_the_prefect_ui_address(monkeypatch) -> None:
    from prefect.settings import PREFECT_UI_URL, temporary_settings

    from flows.pipeline import flow_run_url

    assert flow_run_url(None) is None
    with temporary_settings(updates={PREFECT_UI_URL: "https://prefect.example.org"}):
        assert flow_run_url("abc") == "https://prefect.example.org/runs/flow-run/abc"


def test_cancellation_hook_deletes_cluster_resources_only_on_kubernetes(monkeypatch) -> None:
    from uuid import uuid4

    from prefect.client.schemas.objects import FlowRun
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED, temporary_settings

    import flows.launchers.kubernetes as kubernetes
    from flows.pipeline import delete_cluster_resources, pipeline

    calls = []

    def delete(settings, flow_run_id, *, api_client=None):
        calls.append((settings.namespace, flow_run_id))
        return ["rayjob/grpo-1"]

    def run(params: dict) -> FlowRun:
        return FlowRun(id=uuid4(), name="r", flow_id=uuid4(), parameters={"params": params})

    monkeypatch.setattr(kubernetes, "delete_flow_run_resources", delete)
    state = SimpleNamespace(name="Cancelled")
    cluster = run({"launcher": "kubernetes", "kubernetes": {"namespace": "team"}})
    with temporary_settings(updates={PREFECT_LOGGING_TO_API_ENABLED: False}):  # no API here
        delete_cluster_resources(pipeline, run({"launcher": "local"}), state)
        assert calls == []
        delete_cluster_resources(pipeline, cluster, state)
    assert calls == [("team", str(cluster.id))]
    assert pipeline.on_cancellation_hooks == pipeline.on_crashed_hooks == [delete_cluster_resources]
