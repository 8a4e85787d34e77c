"""The GRPO stage with the tiny model, sync and async, on the runtime's local default topology
(one transformers engine, two env workers, one trainer rank on a local Ray): every metric
reaches MLflow, the samples table and the reward curve are logged, KL to a reference and LoRA
work, and a resumed run continues its MLflow run."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
from mlflow import MlflowClient

from llmrl.config.grpo import GRPOConfig
from llmrl.stages.grpo import run_grpo
from tests.support.configs import stage_config
from tests.support.mlflow_runs import artifact_paths, metric_steps, metric_values
from tests.support.stages import ROLLOUT_METRICS, assert_generates, run_id_of, trainer_state

pytestmark = pytest.mark.slow

"""Logged at every step."""
LOSS_METRICS = (
    "loss",
    "loss_objective",
    "loss_entropy",
    "loss_kl_to_ref",
    "loss_kl_to_inference",
    "kl_approx",
    "clip_fraction",
    "ESS",
    "grad_norm",
    "lr",
)
"""Logged at every step that trained."""


@pytest.fixture(autouse=True)
def _ray(local_ray):
    """Every stage here joins the module's local Ray instead of starting its own."""


def _grpo(data: Path, model: Path, uri: str, *overrides: str, **fields) -> GRPOConfig:
    fields = {"steps": 2, "prompts_per_step": 2, "num_samples": 2, **fields}
    return stage_config(
        GRPOConfig,
        f"data.path={data}",
        f"model.name={model}",
        f"tracking.tracking_uri={uri}",
        "generation.max_new_tokens=8",
        "optimizer.lr=1e-4",
        *overrides,
        output_dir="grpo",
        **fields,
    )


def _samples_table(uri: str, run_id: str, tmp_path: Path, step: int) -> dict:
    local = MlflowClient(uri).download_artifacts(
        run_id, f"samples/samples_step{step:06d}.json", str(tmp_path / "download")
    )
    return json.loads(Path(local).read_text())


def test_grpo_sync_with_reference_kl_and_entropy_logs_every_metric(
    arithmetic_data, tiny_model_dir, mlflow_uri, tmp_path
):
    config = _grpo(
        arithmetic_data,
        tiny_model_dir,
        mlflow_uri,
        "loss.kl_to_ref_coeff=0.1",
        "loss.entropy_coeff=0.01",
        reference=True,
    )
    result = run_grpo(config)

    assert result.step == 2 and result.skipped_steps == 0
    run_id = run_id_of(result.final_checkpoint)
    for key in (*ROLLOUT_METRICS, *LOSS_METRICS, "entropy", "kl_to_ref"):
        assert metric_steps(mlflow_uri, run_id, key) == [1, 2], key
    metrics = MlflowClient(mlflow_uri).get_run(run_id).data.metrics
    # logged floats are stored as float64: the same values (approx's default rel=1e-6); ESS
    # <= 1 (Cauchy-Schwarz) up to a few float32 roundings of its sums (1e-6 ~ 8 eps)
    assert metrics["reward_mean"] == pytest.approx(result.reward_mean)
    assert metrics["accuracy"] == pytest.approx(result.accuracy)
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["reward_std"] >= 0.0
    assert 0.0 < metrics["ESS"] <= 1.0 + 1e-6
    assert 0.0 <= metrics["clip_fraction"] <= 1.0
    assert metrics["entropy"] > 0.0
    assert metrics["loss_entropy"] == pytest.approx(-0.01 * metrics["entropy"], rel=1e-4)
    # the policy starts as the reference: no KL at the first step's update. The reference's
    # log-probs differ from the policy's by a rounding gap d <= log_prob_atol (~3e-4 for the
    # tiny model): k3 ~ d^2 / 2 <= 5e-8, coefficient times that for the loss term
    assert metric_values(mlflow_uri, run_id, "kl_to_ref")[0] == pytest.approx(0.0, abs=1e-5)
    assert metric_values(mlflow_uri, run_id, "loss_kl_to_ref")[0] == pytest.approx(0, abs=1e-6)
    assert 1 <= metrics["response_length_mean"] <= 8
    assert metrics["response_tokens"] == pytest.approx(4 * metrics["response_length_mean"])
    assert metrics["tokens_per_second"] > 0 and metrics["generation_seconds"] > 0
    assert metrics["training_seconds"] > 0 and metrics["weight_sync_seconds"] >= 0
    assert metric_values(mlflow_uri, run_id, "policy_version") == [1, 2]
    assert metric_values(mlflow_uri, run_id, "collector/yielded_turns") == [4, 8]
    assert metric_values(mlflow_uri, run_id, "staleness") == [0, 0]
    assert metric_values(mlflow_uri, run_id, "lr") == pytest.approx([1e-4, 1e-4])

    params = MlflowClient(mlflow_uri).get_run(run_id).data.params
    assert params["num_samples"] == "2" and params["prompts_per_step"] == "2"
    assert params["reference"] == "True" and params["mode"] == "sync"
    assert params["loss.kl_to_ref_coeff"] == "0.1"
    assert params["generation.max_new_tokens"] == "8"
    assert params["train_prompts"] == "40" and params["dataset.digest"]
    assert params["runtime.trainer_world_size"] == "1"
    assert params["runtime.inference_engines"] == "1" and params["runtime.env_workers"] == "2"
    assert params["runtime.strategy"] == "single" and params["runtime.colocated"] == "False"
    assert params["runtime.reference"] == "with_trainer"

    artifacts = artifact_paths(mlflow_uri, run_id)
    assert "reward_curve.png" in artifacts
    assert "samples/samples_step000001.json" in artifacts
    assert any(p.startswith("checkpoints/step-000002/") for p in artifacts)
    table = _samples_table(mlflow_uri, run_id, tmp_path, step=1)
    assert table["columns"] == ["prompt", "response", "reward"]
    assert len(table["data"]) == 4  # 2 prompts x 2 samples
    assert all("What is" in row[0] for row in table["data"])
    state = trainer_state(result.final_checkpoint)
    assert state["step"] == 2 and state["extra"]["collector"]["policy_version"] == 2


def test_grpo_async_runs_end_to_end(arithmetic_data, tiny_model_dir, mlflow_uri):
    config = _grpo(arithmetic_data, tiny_model_dir, mlflow_uri, mode="async", steps=3)
    result = run_grpo(config)

    assert result.step == 3
    assert not [t for t in threading.enumerate() if t.name == "llmrl-rollouts"]
    run_id = run_id_of(result.final_checkpoint)
    for key in ROLLOUT_METRICS:
        assert metric_steps(mlflow_uri, run_id, key) == [1, 2, 3], key
    # max_staleness 1: the first batch is fresh, the next ones drawn while the trainer learned
    staleness = metric_values(mlflow_uri, run_id, "staleness")
    assert staleness == [0, 1, 1], staleness
    for key in LOSS_METRICS:  # every step trained
        assert metric_steps(mlflow_uri, run_id, key) == [1, 2, 3], key
    assert metric_values(mlflow_uri, run_id, "policy_version") == [1, 2, 3]
    assert MlflowClient(mlflow_uri).get_run(run_id).data.params["mode"] == "async"
    assert "reward_curve.png" in artifact_paths(mlflow_uri, run_id)
    assert_generates(result.final_checkpoint)


def test_grpo_with_lora_saves_a_merged_plain_checkpoint(
    arithmetic_data, tiny_model_dir, mlflow_uri
):
    config = _grpo(
        arithmetic_data,
        tiny_model_dir,
        mlflow_uri,
        "lora.enabled=true",
        "lora.r=4",
        "lora.target_modules=[q_proj, v_proj]",
        steps=1,
    )
    result = run_grpo(config)

    checkpoint = Path(result.final_checkpoint).parent
    assert (checkpoint / "adapter" / "adapter_model.safetensors").is_file()
    assert_generates(result.final_checkpoint)


def test_grpo_async_resumes_from_its_last_checkpoint(
    arithmetic_data, tiny_model_dir, mlflow_uri, caplog
):
    config = _grpo(
        arithmetic_data,
        tiny_model_dir,
        mlflow_uri,
        "checkpoint.every=1",
        "checkpoint.keep_last=2",
        mode="async",
    )
    first = run_grpo(config)
    run_id = run_id_of(first.final_checkpoint)
    shutil.rmtree("grpo/checkpoints/step-000002")  # as if it died before saving step 2

    caplog.set_level("INFO", logger="llmrl")
    second = run_grpo(config)

    assert "resuming GRPO from step 1" in caplog.text
    assert run_id_of(second.final_checkpoint) == run_id
    assert not [t for t in threading.enumerate() if t.name == "llmrl-rollouts"]
    for key in ("reward_mean", "policy_version", "staleness"):
        assert metric_steps(mlflow_uri, run_id, key) == [1, 2], key
    state = trainer_state(second.final_checkpoint)
    assert state["extra"]["collector"]["policy_version"] == 2  # as without the restart
    assert [step for step, _ in state["extra"]["reward_history"]] == [1, 2]
    assert state["extra"]["counters"]["skipped_steps"] == second.skipped_steps
