"""Resume after a crash: a stage killed with SIGKILL after a checkpoint and started again with
the same command continues from that checkpoint, ends at the last step, and logs every step to
the same MLflow run exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from safetensors.torch import load_file

from llmrl.cli import main
from llmrl.config.sft import SFTConfig
from llmrl.stages.sft import run_sft
from tests.support.cli import start_cli, wait_until
from tests.support.configs import stage_config
from tests.support.mlflow_runs import metric_steps
from tests.support.stages import assert_generates, run_id_of, trainer_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 5


def _crash_after_checkpoint(
    args: list[str], tmp_path: Path, uri: str, checkpoint: Path, timeout: float = 240
) -> str:
    """Start ``llmrl ARGS``, SIGKILL it once ``checkpoint`` is complete; returns its output."""
    log = tmp_path / "crashed.log"
    process = start_cli(args, tmp_path, log, uri)
    try:
        wait_until(process, (checkpoint / "COMPLETE").is_file, log, timeout)
        process.kill()  # SIGKILL: no cleanup, no "finished" run status
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=60)
    assert process.returncode == -9
    return log.read_text()


def _resume(args: list[str], capsys, caplog) -> tuple[dict, str]:
    """Run the same command again (here, in this process: ``llmrl.cli.main``); returns its JSON
    summary and its log."""
    caplog.set_level("INFO", logger="llmrl")
    code = main(args)
    out = capsys.readouterr().out
    assert code == 0, caplog.text[-4000:]
    return json.loads(out.strip().splitlines()[-1]), caplog.text


def _check_run(uri: str, run_id: str, keys: tuple[str, ...]) -> None:
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"
    for key in keys:  # every step once: the resumed run skips what the crashed one logged
        assert metric_steps(uri, run_id, key) == list(range(1, STEPS + 1)), key


def test_grpo_resumes_after_sigkill(
    arithmetic_data, tiny_model_dir, mlflow_uri, tmp_path, monkeypatch, capsys, caplog
):
    args = [
        "grpo", "--no-progress",
        "--set", f"data.path={arithmetic_data}",
        "--set", f"model.name={tiny_model_dir}",
        "--set", f"steps={STEPS}",
        "--set", "prompts_per_step=2",
        "--set", "num_samples=2",
        "--set", "generation.max_new_tokens=8",
        "--set", "checkpoint.every=2",
        "--set", "output_dir=grpo",
    ]  # fmt: skip
    checkpoints = tmp_path / "grpo" / "checkpoints"
    _crash_after_checkpoint(args, tmp_path, mlflow_uri, checkpoints / "step-000002")
    first_run = run_id_of(checkpoints / "step-000002")
    assert not (checkpoints / f"step-{STEPS:06d}").exists()

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    summary, log = _resume(args, capsys, caplog)

    assert "resuming GRPO from step" in log
    assert summary["step"] == STEPS
    final = checkpoints / f"step-{STEPS:06d}"
    assert summary["final_checkpoint"] == str(Path("grpo/checkpoints/step-000005/model"))
    state = trainer_state(final)
    assert state["step"] == STEPS and state["extra"]["mlflow_run_id"] == first_run
    assert [step for step, _ in state["extra"]["reward_history"]] == list(range(1, STEPS + 1))
    assert state["extra"]["collector"]["policy_version"] == STEPS
    _check_run(mlflow_uri, first_run, ("reward_mean", "accuracy", "loss_objective", "kl_approx"))
    assert_generates(final / "model")


def test_sft_resumes_after_sigkill_exactly(
    arithmetic_data, tiny_model_dir, mlflow_uri, tmp_path, monkeypatch, capsys, caplog
):
    sets = [
        f"data.path={arithmetic_data}",
        f"model.name={tiny_model_dir}",
        f"steps={STEPS}",
        "batch_size=2",
        "eval_every=2",
        "eval_batches=1",
        "data.max_train_rows=8",
        "data.max_eval_rows=2",
        "optimizer.lr=1e-3",
        "checkpoint.every=2",
    ]
    args = ["sft", "--no-progress", *(a for s in [*sets, "output_dir=sft"] for a in ("--set", s))]
    checkpoints = tmp_path / "sft" / "checkpoints"
    _crash_after_checkpoint(args, tmp_path, mlflow_uri, checkpoints / "step-000002")
    first_run = run_id_of(checkpoints / "step-000002")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    summary, log = _resume(args, capsys, caplog)

    assert "resuming SFT from step" in log
    assert summary["step"] == STEPS
    final = checkpoints / f"step-{STEPS:06d}"
    assert run_id_of(final) == first_run
    _check_run(mlflow_uri, first_run, ("loss", "grad_norm", "lr"))
    assert metric_steps(mlflow_uri, first_run, "eval_loss") == [2, 4, 5]
    assert_generates(final / "model")

    # The resumed run ends with the weights of a run that never stopped (same data order,
    # schedule, optimizer state and RNG).
    straight = run_sft(
        stage_config(SFTConfig, *sets, "tracking.enabled=false", output_dir="straight")
    )
    resumed = load_file(final / "model" / "model.safetensors")
    uninterrupted = load_file(Path(straight.final_checkpoint) / "model.safetensors")
    # the same ops in the same order on the same host: bitwise equal is expected, and the
    # tolerance is only ~80 eps (a reduction reordered anywhere would move Adam's update of a
    # near-zero gradient by up to lr = 1e-3 and fail: this test is for exactness)
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
