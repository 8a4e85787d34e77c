"""Run comparison against a real (SQLite) MLflow store, with runs this test logs itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmrl.tracking.comparison import CompareError, compare_runs, comparison_panels
from tests.support.mlflow_runs import PNG_MAGIC, Runs

MODELS = ("base", "sft", "grpo")


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, Runs]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return uri, Runs(uri)


def test_compare_pipeline_and_grpo_runs_into_one_picture(store, tmp_path: Path) -> None:
    uri, runs = store
    a = runs.pipeline("cmp", "pipeline-a", [0.1, 0.2, 0.4], {"base": 0.1, "sft": 0.3, "grpo": 0.35})
    # B's GRPO result was reused from an earlier run: the tag names it, it is not B's child.
    b = runs.pipeline("cmp", "pipeline-b", [], {"base": 0.1, "sft": 0.2, "grpo": 0.5})
    reused = runs.run("cmp", "grpo", "grpo")
    runs.metrics(reused, "reward_mean", [0.0, 0.5])
    runs.client.set_tag(b, "llmrl.run.grpo", reused)
    standalone = runs.run("solo", "grpo", "grpo")
    runs.metrics(standalone, "reward_mean", [0.3, 0.3, 0.3, 0.6])

    comparison = compare_runs(uri, [a, b, standalone], tmp_path / "out", models=MODELS)

    assert comparison.picture == tmp_path / "out" / "comparison.png"
    assert comparison.picture.read_bytes()[:8] == PNG_MAGIC
    drawn = {r.run_id: r for r in comparison.runs}
    assert list(drawn) == [a, b, standalone]
    assert drawn[a].reward == [(1, 0.1), (2, 0.2), (3, 0.4)]
    assert drawn[a].accuracy == {"base": 0.1, "sft": 0.3, "grpo": 0.35}
    assert drawn[b].reward_run_id == reused and drawn[b].reward == [(1, 0.0), (2, 0.5)]
    assert drawn[standalone].accuracy == {} and drawn[standalone].missing == ["accuracy_<model>"]
    reward, accuracy = comparison_panels(comparison.runs, MODELS)
    assert set(reward.series) == {r.label for r in comparison.runs}
    assert accuracy.categories == MODELS
    assert accuracy.series[drawn[a].label] == [(0.0, 0.1), (1.0, 0.3), (2.0, 0.35)]
    assert drawn[standalone].label not in accuracy.series

    # Logged on a new run of the first run's experiment, with the picture and the numbers.
    client = runs.client
    logged = client.get_run(comparison.run_id)
    assert logged.info.experiment_id == client.get_run(a).info.experiment_id
    assert logged.info.run_name == "compare-3-runs"
    assert logged.data.tags["llmrl.stage"] == "compare"
    assert logged.data.tags["llmrl.compared_runs"] == f"{a},{b},{standalone}"
    assert "mlflow.parentRunId" not in logged.data.tags
    assert {f.path for f in client.list_artifacts(comparison.run_id)} == {
        "comparison.png",
        "comparison.json",
    }
    numbers = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert [n["run_id"] for n in numbers] == [a, b, standalone]


def test_an_experiment_name_compares_its_newest_pipeline_runs(store, tmp_path: Path) -> None:
    uri, runs = store
    first = runs.pipeline("exp", "p1", [0.1, 0.2], {"base": 0.1})
    second = runs.pipeline("exp", "p2", [], {"base": 0.2, "sft": 0.4})  # GRPO skipped
    comparison = compare_runs(uri, ["exp"], tmp_path, models=MODELS)
    assert [r.run_id for r in comparison.runs] == [second, first]
    assert comparison.runs[0].missing == ["reward_mean"]
    assert compare_runs(uri, ["exp"], tmp_path, max_runs=1).runs[0].run_id == second


def test_clear_errors(store, tmp_path: Path) -> None:
    uri, runs = store
    with pytest.raises(CompareError, match="'0123456789abcdef0123456789abcdef' is neither a run"):
        compare_runs(uri, ["0123456789abcdef0123456789abcdef"], tmp_path)
    with pytest.raises(CompareError, match="'nowhere' is neither a run id nor an experiment"):
        compare_runs(uri, ["nowhere"], tmp_path)
    runs.client.create_experiment("empty")
    with pytest.raises(CompareError, match="experiment 'empty' has no pipeline or GRPO runs"):
        compare_runs(uri, ["empty"], tmp_path)
    bare = runs.run("other", "pipeline-bare", "pipeline")
    with pytest.raises(CompareError, match=rf"run {bare} \(pipeline-bare\) has none of the"):
        compare_runs(uri, [bare], tmp_path)
    assert not (tmp_path / "comparison.png").exists()
