"""The GRPO stage with the tiny model, sync and async: every metric reaches MLflow, the samples
table and the reward curve are logged, KL to a reference and LoRA work."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from mlflow import MlflowClient

from llmrl.config.grpo import GRPOConfig
from llmrl.train.grpo import run_grpo
from tests.train.conftest import (
    artifact_paths,
    assert_generates,
    metric_steps,
    metric_values,
    run_id_of,
    stage_config,
)

ROLLOUT_METRICS = (
    "reward_mean",
    "reward_std",
    "accuracy",
    "format_rate",
    "response_length_mean",
    "response_tokens",
    "tokens_per_second",
    "generation_seconds",
    "training_seconds",
    "weight_sync_seconds",
    "dropped_zero_std_groups",
    "stale_batches",
    "skipped_steps",
    "policy_version",
    "staleness",
)
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

    assert result.step == 2 and result.stale_batches == 0 and result.skipped_steps == 0
    run_id = run_id_of(result.final_checkpoint)
    for key in (*ROLLOUT_METRICS, *LOSS_METRICS, "entropy", "kl_to_ref"):
        assert metric_steps(mlflow_uri, run_id, key) == [1, 2], key
    metrics = MlflowClient(mlflow_uri).get_run(run_id).data.metrics
    assert metrics["reward_mean"] == pytest.approx(result.reward_mean)
    assert metrics["accuracy"] == pytest.approx(result.accuracy)
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["reward_std"] >= 0.0
    assert 0.0 < metrics["ESS"] <= 1.0 + 1e-6
    assert 0.0 <= metrics["clip_fraction"] <= 1.0
    assert metrics["entropy"] > 0.0
    assert metrics["loss_entropy"] == pytest.approx(-0.01 * metrics["entropy"], rel=1e-4)
    # the policy starts as the reference: no KL at the first step's update
    assert metric_values(mlflow_uri, run_id, "kl_to_ref")[0] == pytest.approx(0.0, abs=1e-5)
    assert metric_values(mlflow_uri, run_id, "loss_kl_to_ref")[0] == pytest.approx(0, abs=1e-6)
    assert 1 <= metrics["response_length_mean"] <= 8
    assert metrics["response_tokens"] == pytest.approx(4 * metrics["response_length_mean"])
    assert metrics["tokens_per_second"] > 0 and metrics["generation_seconds"] > 0
    assert metrics["training_seconds"] > 0 and metrics["weight_sync_seconds"] >= 0
    assert metric_values(mlflow_uri, run_id, "policy_version") == [1, 2]
    assert metric_values(mlflow_uri, run_id, "staleness") == [0, 0]
    assert metric_values(mlflow_uri, run_id, "lr") == pytest.approx([1e-4, 1e-4])

    params = MlflowClient(mlflow_uri).get_run(run_id).data.params
    assert params["num_samples"] == "2" and params["prompts_per_step"] == "2"
    assert params["reference"] == "True" and params["mode"] == "sync"
    assert params["loss.kl_to_ref_coeff"] == "0.1"
    assert params["generation.max_new_tokens"] == "8"
    assert params["train_prompts"] == "40" and params["dataset.digest"]

    artifacts = artifact_paths(mlflow_uri, run_id)
    assert "reward_curve.png" in artifacts
    assert "samples/samples_step000001.json" in artifacts
    assert any(p.startswith("checkpoints/step-000002/") for p in artifacts)
    table = _samples_table(mlflow_uri, run_id, tmp_path, step=1)
    assert table["columns"] == ["prompt", "response", "reward"]
    assert len(table["data"]) == 4  # 2 prompts x 2 samples
    assert all("What is" in row[0] for row in table["data"])
    state = json.loads(Path(result.final_checkpoint).parent.joinpath("trainer_state.json").read_text())
    assert state["step"] == 2 and state["extra"]["collector"]["policy_version"] == 2


def test_grpo_async_runs_end_to_end(arithmetic_data, tiny_model_dir, mlflow_uri):
    config = _grpo(arithmetic_data, tiny_model_dir, mlflow_uri, mode="async", steps=3)
    result = run_grpo(config)

    assert result.step == 3
    assert not [t for t in threading.enumerate() if t.name == "llmrl-rollouts"]
    run_id = run_id_of(result.final_checkpoint)
    for key in ROLLOUT_METRICS:
        assert metric_steps(mlflow_uri, run_id, key) == [1, 2, 3], key
    # Every step either trained on a fresh enough batch or dropped a stale one, and counted it.
    staleness = metric_values(mlflow_uri, run_id, "staleness")
    stale = metric_values(mlflow_uri, run_id, "stale_batches")
    trained = metric_steps(mlflow_uri, run_id, "loss_objective")
    assert staleness[0] == 0 and 1 in trained
    for step, age in enumerate(staleness, start=1):
        assert (step in trained) == (age <= config.max_staleness), (step, staleness)
    assert stale == [sum(age > config.max_staleness for age in staleness[:n]) for n in (1, 2, 3)]
    assert result.stale_batches == stale[-1]
    for key in LOSS_METRICS:
        assert metric_steps(mlflow_uri, run_id, key) == trained, key
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
