"""The SFT stage with the tiny model: it learns, checkpoints, logs to MLflow, trains LoRA."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from safetensors.torch import load_file

from llmrl.config.sft import SFTConfig
from llmrl.stages.sft import run_sft
from tests.support.configs import stage_config
from tests.support.mlflow_runs import metric_steps, metric_values
from tests.support.stages import assert_generates, run_id_of


def _sft(data: Path, model: Path, uri: str, *overrides: str, **fields) -> SFTConfig:
    return stage_config(
        SFTConfig,
        f"data.path={data}",
        f"model.name={model}",
        f"tracking.tracking_uri={uri}",
        *overrides,
        output_dir="sft",
        **fields,
    )


def _two_steps(data: Path, model: Path, uri: str, *overrides: str) -> SFTConfig:
    """Two steps of 2 examples at a constant lr, 2 eval rows: enough to check what is saved."""
    overrides = (*overrides, "optimizer.warmup_steps=0", "data.max_eval_rows=2")
    return _sft(data, model, uri, *overrides, steps=2, batch_size=2)


def test_sft_lowers_the_training_loss_checkpoints_and_logs_eval_loss(
    arithmetic_data, tiny_model_dir, mlflow_uri
):
    # Overfit one fixed batch of 4 examples: the loss must fall, whatever the random init.
    config = _sft(
        arithmetic_data,
        tiny_model_dir,
        mlflow_uri,
        "data.max_train_rows=4",
        "data.max_eval_rows=4",
        "optimizer.lr=1e-3",
        "optimizer.warmup_steps=0",
        "optimizer.schedule=constant",
        "checkpoint.every=5",
        steps=15,
        batch_size=4,
        eval_every=5,
        eval_batches=1,
    )
    result = run_sft(config)

    assert result.step == 15 and result.skipped_steps == 0
    run_id = run_id_of(result.final_checkpoint)
    losses = metric_values(mlflow_uri, run_id, "loss")
    assert metric_steps(mlflow_uri, run_id, "loss") == list(range(1, 16))
    assert losses[-1] < losses[0] - 1.0, losses
    assert max(losses[1:]) < losses[0], losses
    # MLflow keeps the logged floats as float64: the same values (approx's default rel=1e-6)
    assert result.train_loss == pytest.approx(losses[-1])
    assert metric_steps(mlflow_uri, run_id, "eval_loss") == [5, 10, 15]
    assert result.eval_loss == pytest.approx(metric_values(mlflow_uri, run_id, "eval_loss")[-1])
    for key in ("grad_norm", "lr", "skipped_steps", "step_seconds"):
        assert metric_steps(mlflow_uri, run_id, key) == list(range(1, 16)), key
    assert metric_values(mlflow_uri, run_id, "lr") == pytest.approx([1e-3] * 15)

    run = MlflowClient(mlflow_uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["steps"] == "15"
    assert run.data.params["optimizer.lr"] == "0.001"
    assert run.data.params["train_examples"] == "4"
    assert run.data.tags["llmrl.stage"] == "sft"

    # every 5 steps, the last 2 kept (the best by eval_loss is the newest: the loss falls)
    checkpoints = Path("sft/checkpoints")
    assert sorted(p.name for p in checkpoints.glob("step-*")) == ["step-000010", "step-000015"]
    assert result.final_checkpoint == str(checkpoints / "step-000015" / "model")
    state = json.loads((checkpoints / "step-000015" / "trainer_state.json").read_text())
    assert state["step"] == 15
    assert set(state["extra"]) == {"batches", "skipped_steps", "mlflow_run_id"}
    assert state["metrics"]["eval_loss"] == pytest.approx(result.eval_loss)
    assert_generates(result.final_checkpoint)


def test_sft_with_lora_saves_a_merged_plain_checkpoint(arithmetic_data, tiny_model_dir, mlflow_uri):
    config = _two_steps(
        arithmetic_data,
        tiny_model_dir,
        mlflow_uri,
        "lora.enabled=true",
        "lora.r=4",
        "lora.target_modules=[q_proj, v_proj]",
        "optimizer.lr=1e-2",
    )
    result = run_sft(config)

    checkpoint = Path(result.final_checkpoint).parent
    assert (checkpoint / "adapter" / "adapter_model.safetensors").is_file()
    assert_generates(result.final_checkpoint)
    base = load_file(tiny_model_dir / "model.safetensors")
    merged = load_file(checkpoint / "model" / "model.safetensors")
    assert set(merged) == set(base)  # a plain Llama: no lora_A / lora_B / base_layer keys
    for name in base:  # only the adapted projections moved
        changed = not torch.equal(base[name], merged[name])
        assert changed == any(proj in name for proj in ("q_proj", "v_proj")), name


def test_sft_in_bfloat16_trains_float32_masters_and_saves_bfloat16(
    arithmetic_data, tiny_model_dir, mlflow_uri
):
    from llmrl.models import tiny_model
    from llmrl.train.checkpoint import load_checkpoint, read_training_state

    config = _two_steps(
        arithmetic_data,
        tiny_model_dir,
        mlflow_uri,
        "model.dtype=bfloat16",
        "model.log_prob_chunk_size=16",  # several chunks per micro-batch
        "optimizer.lr=1e-5",
    )
    result = run_sft(config)

    checkpoint = Path(result.final_checkpoint).parent
    saved = load_file(checkpoint / "model" / "model.safetensors")
    masters = read_training_state(checkpoint)["master_weights"]
    start = load_file(tiny_model_dir / "model.safetensors")
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}  # what engines and eval load
    for name, weight in saved.items():
        assert masters[name].dtype == torch.float32
        assert torch.equal(weight, masters[name].to(torch.bfloat16)), name  # cast from masters
    # two AdamW steps of 1e-5 move nearly every element with a gradient in float32 (bfloat16
    # weights would keep most of them: their spacing is ~100x the update)
    moved = (
        masters["model.layers.0.mlp.up_proj.weight"] != start["model.layers.0.mlp.up_proj.weight"]
    )
    assert moved.float().mean() > 0.99
    # a resume loads the masters, not the rounded weights of model/
    fresh = tiny_model(seed=5)
    load_checkpoint(checkpoint, model=fresh)
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, masters[name]), name

    run_id = run_id_of(result.final_checkpoint)
    peaks = metric_values(mlflow_uri, run_id, "peak_memory_mb")
    assert metric_steps(mlflow_uri, run_id, "peak_memory_mb") == [1, 2]
    assert all(100 < peak < 24 * 1024 for peak in peaks), peaks  # this process's RSS, in MiB


@pytest.mark.parametrize("lora", [False, True])
def test_minor_sft_with_kl_to_a_reference_trains_and_logs_its_parts(
    arithmetic_data, tiny_model_dir, mlflow_uri, lora
):
    lora_options = ["lora.enabled=true", "lora.r=4"] if lora else []
    config = _sft(
        arithmetic_data,
        tiny_model_dir,
        mlflow_uri,
        *lora_options,
        "optimizer.lr=1e-2",
        "optimizer.warmup_steps=0",
        "data.max_eval_rows=2",
        loss_function="minor_sft",
        reference=True,
        kl_to_ref_coeff=0.5,
        steps=2,
        batch_size=2,
    )
    result = run_sft(config)

    assert result.skipped_steps == 0
    run_id = run_id_of(result.final_checkpoint)
    values = {
        key: metric_values(mlflow_uri, run_id, key)
        for key in ("loss", "minor_sft", "nll", "kl_to_ref", "loss_kl_to_ref")
    }
    # step 1: the model is the reference (LoRA's B starts at 0), so log p - log p_ref = 0:
    # MinorSFT = -log sigmoid(0.1 * 0) = log 2 and the KL is 0. (A rounding gap d between the
    # two scorings, <= log_prob_atol ~3e-4, would move MinorSFT by 0.1 d / 2 <= 1.7e-5 and
    # the KL by d^2 / 2; measured: exactly log 2 and 0 in float32.) Step 2's parts are one
    # multiply and one add apart: rel=1e-5 is ~80 eps.
    assert values["minor_sft"][0] == pytest.approx(math.log(2), abs=1e-6)
    assert values["kl_to_ref"][0] == pytest.approx(0.0, abs=1e-6)
    assert values["loss"][0] == pytest.approx(math.log(2), abs=1e-6)
    # step 2: the model moved away from the reference; the loss holds both terms
    assert values["kl_to_ref"][1] > 0
    assert values["loss_kl_to_ref"][1] == pytest.approx(0.5 * values["kl_to_ref"][1], rel=1e-5)
    assert values["loss"][1] == pytest.approx(
        values["minor_sft"][1] + values["loss_kl_to_ref"][1], rel=1e-5
    )
    assert values["nll"][0] > values["minor_sft"][0]  # the NLL is logged beside it
    assert result.eval_loss is not None and math.isfinite(result.eval_loss)


@pytest.mark.integration
def test_sft_logs_to_a_real_mlflow_server(arithmetic_data, tiny_model_dir, mlflow_server):
    config = _sft(
        arithmetic_data,
        tiny_model_dir,
        mlflow_server.uri,
        "data.max_train_rows=4",
        "data.max_eval_rows=2",
        steps=2,
        batch_size=2,
        eval_every=1,
        eval_batches=1,
    )
    result = run_sft(config)

    client = MlflowClient(mlflow_server.uri)
    run = client.get_run(run_id_of(result.final_checkpoint))
    assert run.info.status == "FINISHED"
    assert run.data.params["steps"] == "2"
    for key in ("loss", "eval_loss", "grad_norm", "lr"):
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == [1, 2], key
    assert run.data.metrics["loss"] == pytest.approx(result.train_loss)  # the same float64
    assert any(a.path == "checkpoints" for a in client.list_artifacts(run.info.run_id))
    assert not Path("spool").exists() or not any(Path("spool").rglob("*.jsonl"))
    # The final model, uploaded through the server into the registry, and the data read.
    (version,) = client.search_model_versions("name = 'llmrl-sft'")
    assert version.run_id == run.info.run_id
    assert run.data.tags["llmrl.registered_model"] == f"llmrl-sft/{version.version}"
    (output,) = run.outputs.model_outputs
    files = {f.path for f in client.list_logged_model_artifacts(output.model_id)}
    assert {"config.json", "model.safetensors", "MLmodel"} <= files
    contexts = {
        i.dataset.name.rsplit("/", 1)[1]: {t.key: t.value for t in i.tags}["mlflow.data.context"]
        for i in run.inputs.dataset_inputs
    }
    assert contexts == {"train": "training", "eval": "evaluation"}
