"""The example project (``examples/unit-conversion``) through the pipeline flow, as a user runs
it: their dataset file, their reward functions (one a group form), llmrl unedited. Once with the
package installed the way a user installs it (``pip install -e``), once shipped only through
the pipeline's ``runtime_env.py_modules``; both times the user's rewards reach MLflow.

The installed run: prepare the 120 rows -> SFT 2 steps -> GRPO 2 steps of 2 prompts x 2
samples -> the evaluations after SFT and after GRPO on 5 rows, on the tiny random model (what
the rewards are is the point, not what the model learns); the shipped run: prepare -> GRPO
(where the user's code runs in the env workers; SFT's data and the evaluations build the same
task from the same manifest as in the first run). Each stage is a process of its own, so the
two runs cost about 5 minutes of the slow tier.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.pipeline import PipelineParams, pipeline
from tests.support.pipeline_runs import child_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "unit-conversion"
DISTRIBUTION = "llmrl-example-units"
GRPO_STEPS = 2


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of the example project (a user's checkout), outside any folder on sys.path."""
    copy = tmp_path_factory.mktemp("user") / "unit-conversion"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("prepared", "*.egg-info"))
    return copy


def params(project: Path, root: Path, tiny_model_dir: Path, **extra: Any) -> PipelineParams:
    model = f"model.name={tiny_model_dir}"
    configs = project / "configs"
    return PipelineParams(
        prepare_config=str(configs / "prepare.yaml"),
        sft_config=str(configs / "sft.yaml"),
        grpo_config=str(configs / "grpo.yaml"),
        eval_config=str(configs / "eval.yaml"),
        work_dir=str(root / "work"),
        mlflow_tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
        experiment="own-task",
        overrides={
            "prepare": [f"source={project / 'data/units.jsonl'}", f"output_dir={root / 'data'}"],
            "sft": [model, "steps=2", "batch_size=2", "eval_every=1", "checkpoint.every=2"],
            "grpo": [
                model,
                f"steps={GRPO_STEPS}",
                "prompts_per_step=2",
                "num_samples=2",
                "generation.max_new_tokens=8",
                f"checkpoint.every={GRPO_STEPS}",
            ],
            "eval": [model, "max_new_tokens=8", "batch_size=5", "data.max_eval_rows=5"],
        },
        retry_delay_s=0,
        **extra,
    )


@pytest.fixture
def installed(project: Path) -> Iterator[Path]:
    """The project installed into this environment with ``pip install -e``, removed after."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-build-isolation", "-e", str(project)], check=True
    )
    try:
        yield project
    finally:
        subprocess.run([*pip, "uninstall", "--yes", DISTRIBUTION], check=True)


def grpo_metrics(root: Path) -> dict[str, list[float]]:
    """Every metric history of the run's GRPO stage, by key."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("own-task")
    (parent,) = [
        run
        for run in client.search_runs([experiment.experiment_id])
        if "mlflow.parentRunId" not in run.data.tags
    ]
    grpo = child_runs(client, "own-task", parent.info.run_id)["grpo"]
    return {
        key: [m.value for m in client.get_metric_history(grpo.info.run_id, key)]
        for key in grpo.data.metrics
    }


def check_user_rewards(state: Any, root: Path) -> None:
    assert state.is_completed(), state
    metrics = grpo_metrics(root)
    for name in ("correct_value", "concise", "task"):
        assert metrics[f"{name}/failures"] == [0.0] * GRPO_STEPS, name
    # the group form ranks a group's 2 replies 1 and 0 (or 0.5 and 0.5 when as long): mean 0.5
    assert metrics["concise/score_mean"] == [0.5] * GRPO_STEPS
    assert len(metrics["correct_value/score_mean"]) == GRPO_STEPS
    manifest = next((root / "data").glob("reward-functions-*/manifest.json")).read_text()
    assert "units_task.rewards:concise" in manifest


def test_the_installed_project_trains_with_its_rewards(
    installed: Path, tiny_model_dir: Path, prefect_api, tmp_path: Path
) -> None:
    run = params(installed, tmp_path, tiny_model_dir, skip=["eval-base"])
    assert run.task_label() == "reward-functions"
    state = pipeline(run, return_state=True)
    check_user_rewards(state, tmp_path)


def test_the_project_shipped_through_py_modules_alone(
    project: Path, tiny_model_dir: Path, prefect_api, tmp_path: Path
) -> None:
    probe = [sys.executable, "-c", "import units_task"]
    assert subprocess.run(probe, cwd=tmp_path, capture_output=True).returncode != 0
    shipped = params(
        project,
        tmp_path,
        tiny_model_dir,
        runtime_env={"py_modules": [str(project / "units_task")]},
        skip=["sft", "eval"],  # the first run has them; GRPO starts from the tiny model
    )
    state = pipeline(shipped, return_state=True)
    check_user_rewards(state, tmp_path)
