"""`configs/grpo-distributed.yaml` end to end through the CLI: 1 transformers engine, 2 env
workers and 2 DDP trainer ranks on a local Ray. A trainer rank that dies makes the stage exit
non-zero naming it; the re-run resumes from the last checkpoint and MLflow holds every step
exactly once."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow import MlflowClient

from llmrl.core.faults import FAULT_ENV
from tests.support.cli import cli_env
from tests.support.mlflow_runs import metric_steps, metric_values
from tests.support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = REPO / "configs" / "grpo-distributed.yaml"
PER_STEP = (
    "reward_mean",
    "loss",
    "grad_norm",
    "generation_seconds",
    "training_seconds",
    "weight_sync_seconds",
    "policy_version",
    "staleness",
)


def _grpo(tmp_path: Path, data: Path, model: Path, uri: str, fault: str | None = None):
    sets = [
        f"data.path={data}",
        f"model.name={model}",
        "generation.max_new_tokens=6",
        "optimizer.lr=1e-4",
        "checkpoint.every=1",
        "checkpoint.keep_last=2",
        f"checkpoint.dir={tmp_path / 'checkpoints'}",
        f"tracking.tracking_uri={uri}",
    ]
    # Ray's socket paths must stay under 108 bytes: a short folder of its own in /tmp
    env = {**cli_env(tmp_path), "RAY_TMPDIR": tempfile.mkdtemp(prefix="ray-")}
    env["MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"] = "false"
    if fault:
        env[FAULT_ENV] = fault
    command = [sys.executable, "-m", "llmrl.cli", "grpo", "--config", str(CONFIG), "--no-progress"]
    command += [arg for value in sets for arg in ("--set", value)]
    try:
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)


def test_distributed_config_survives_a_dead_rank_and_resumes_exactly(
    tmp_path, arithmetic_data, tiny_model_dir, mlflow_uri
):
    killed = _grpo(tmp_path, arithmetic_data, tiny_model_dir, mlflow_uri, fault="backward:3")
    output = killed.stdout + killed.stderr
    assert killed.returncode != 0, output
    assert "died during train" in output and "trainer rank" in output, output[-3000:]
    assert "Re-run the stage to resume from the last checkpoint" in output
    assert "2 trainer rank(s) ready (ddp, fresh)" in output

    resumed = _grpo(tmp_path, arithmetic_data, tiny_model_dir, mlflow_uri)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]
    assert "resuming GRPO from step 2" in output
    assert "2 trainer rank(s) ready (ddp, resumed from" in output

    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs(client.get_experiment_by_name("llmrl").experiment_id)
    for key in PER_STEP:  # each step once: none lost to the kill, none doubled by the re-run
        assert sorted(metric_steps(mlflow_uri, run.info.run_id, key)) == [1, 2, 3], key
    assert metric_values(mlflow_uri, run.info.run_id, "policy_version") == [1, 2, 3]
    assert all(v > 0 for v in metric_values(mlflow_uri, run.info.run_id, "weight_sync_seconds"))
    assert metric_values(mlflow_uri, run.info.run_id, "staleness") == [0, 0, 0]
    params = run.data.params
    assert params["runtime.trainer_world_size"] == "2"
    assert params["runtime.inference_engines"] == "1" and params["runtime.env_workers"] == "2"
    assert params["runtime.strategy"] == "ddp" and params["runtime.colocated"] == "False"
    assert (tmp_path / "checkpoints" / "step-000003" / "COMPLETE").is_file()
