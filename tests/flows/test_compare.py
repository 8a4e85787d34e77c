"""``python -m flows compare`` under Prefect's test harness, against a SQLite MLflow store with
runs the test logs itself: the picture, the MLflow comparison run, the Prefect artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from flows.__main__ import main
from flows.compare import compare
from tests.support.mlflow_runs import PNG_MAGIC, Runs
from tests.support.prefect_harness import filter_by_flow_run

pytestmark = pytest.mark.integration


@pytest.fixture
def logged(tmp_path: Path) -> tuple[str, list[str]]:
    """Two pipeline runs of experiment ``cmp``: rewards per GRPO step and accuracies."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = Runs(uri)
    first = runs.pipeline("cmp", "pipeline-a", [0.1, 0.3], {"base": 0.1, "sft": 0.2, "grpo": 0.3})
    second = runs.pipeline("cmp", "pipeline-b", [0.2, 0.1], {"base": 0.1, "sft": 0.3})
    return uri, [first, second]


def test_compare_flow_logs_the_picture_to_mlflow_and_prefect(
    prefect_api, logged, tmp_path: Path
) -> None:
    uri, (first, second) = logged
    state = compare([first, second], uri, str(tmp_path / "out"), "http://mlflow.test", 10,
                    return_state=True)  # fmt: skip
    assert state.is_completed(), state.message
    result: dict[str, Any] = state.result()
    assert Path(result["picture"]).read_bytes()[:8] == PNG_MAGIC
    assert [r["run_id"] for r in result["runs"]] == [first, second]
    assert result["runs"][1]["accuracy"] == {"base": 0.1, "sft": 0.3}
    logged_run = MlflowClient(uri).get_run(result["mlflow_run_id"])
    assert logged_run.data.tags["llmrl.compared_runs"] == f"{first},{second}"
    assert result["mlflow_link"].startswith("http://mlflow.test/#/experiments/")

    artifacts = {
        a["key"]: a for a in filter_by_flow_run("artifacts", state.state_details.flow_run_id)
    }
    image = artifacts["llmrl-comparison"]
    assert image["type"] == "image"
    assert image["data"] == (
        f"http://mlflow.test/get-artifact?path=comparison.png&run_uuid={result['mlflow_run_id']}"
    )
    markdown = artifacts["llmrl-comparison-summary"]["data"]
    assert f"![reward and accuracy]({image['data']})" in markdown
    assert "| pipeline-a (" in markdown and "| 2 | 0.300 | 0.100 | 0.200 | 0.300 | - |" in markdown


def test_compare_command_line(prefect_api, logged, tmp_path: Path, capsys) -> None:
    uri, _ = logged
    out = tmp_path / "cli"
    assert main(["compare", "cmp", "--mlflow-tracking-uri", uri, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"picture: {out / 'comparison.png'}" in printed
    assert "pipeline-a (" in printed and "2 GRPO steps" in printed
    assert (out / "comparison.png").is_file()
    code = main(["compare", "0" * 32, "--mlflow-tracking-uri", uri, "--out", str(out / "x")])
    assert code == 2
    assert f"'{'0' * 32}' is neither a run id nor an experiment name" in capsys.readouterr().err
