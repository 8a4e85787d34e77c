"""Dynamic sampling (``advantage.drop_zero_std``) in a real GRPO step, with a task whose reward
signal is fixed per prompt: the step trains on exactly ``prompts_per_step`` groups with signal,
counts its extra rounds, and stops at ``advantage.max_resample_rounds`` when no prompt has a
signal. In the in-process composition (the benchmarks') and on the Ray runtime."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from tensordict import TensorDictBase

from llmrl.config.grpo import GRPOConfig
from llmrl.data.non_tensor import as_list
from tests.support.configs import stage_config
from tests.support.fixed_reward_task import FixedRewardTask
from tests.support.paths import REPO

PROMPTS, G = 2, 2


def _config(data: Path, model: Path, *overrides: str, **fields) -> GRPOConfig:
    return stage_config(
        GRPOConfig,
        f"data.path={data}",
        f"model.name={model}",
        "generation.max_new_tokens=4",
        "optimizer.lr=1e-4",
        "runtime.torch_threads=1",
        "advantage.drop_zero_std=true",
        *overrides,
        **{"prompts_per_step": PROMPTS, "num_samples": G, **fields},
    )


def _groups(batch: TensorDictBase) -> list[tuple[str, list[float]]]:
    """(answer, rewards) of every group of a batch, in order (G consecutive rows a group)."""
    answers, rewards = as_list(batch["answer"]), batch["reward"].reshape(-1).tolist()
    return [(str(answers[i]), rewards[i : i + G]) for i in range(0, len(rewards), G)]


def _check_step(
    task: FixedRewardTask, batch: TensorDictBase, metrics: dict, trained: TensorDictBase | None
) -> None:
    """The rounds the step sampled (``batch``: all of them) were exactly those needed."""
    groups = _groups(batch)
    rounds = int(metrics["sampling_rounds"])
    assert len(groups) == rounds * PROMPTS
    signal = [task.informative(answer) and len(set(r)) > 1 for answer, r in groups]
    before_last = sum(signal[: (rounds - 1) * PROMPTS])
    assert before_last < PROMPTS <= sum(signal)  # stopped at the first round that filled it
    assert metrics["resampled_groups"] == (rounds - 1) * PROMPTS
    assert metrics["zero_std_groups"] == len(groups) - sum(signal)
    # a ratio of counts, one division each side (approx's default rel=1e-6 is ample)
    assert metrics["informative_group_fraction"] == pytest.approx(sum(signal) / len(groups))
    assert metrics["trained_groups"] == PROMPTS
    assert metrics["surplus_groups"] == sum(signal) - PROMPTS
    if trained is not None:
        trained_groups = _groups(trained)
        assert len(trained_groups) == PROMPTS
        assert all(len(set(r)) > 1 for _, r in trained_groups)


def test_in_process_steps_train_on_exactly_prompts_per_step_groups_with_signal(
    arithmetic_data, tiny_model_dir, monkeypatch
):
    from llmrl.runtime import grpo_loop as inprocess

    _, manifest = inprocess.prepared_task(arithmetic_data)
    monkeypatch.setattr(inprocess, "prepared_task", lambda path: (FixedRewardTask(), manifest))
    grpo = inprocess.InProcessGRPO(_config(arithmetic_data, tiny_model_dir))
    trained: list[TensorDictBase] = []
    train = grpo.trainer.train
    monkeypatch.setattr(
        grpo.trainer, "train", lambda batch, *a, **k: trained.append(batch) or train(batch, *a, **k)
    )
    rounds = []
    for number in (1, 2, 3):
        batch, metrics = grpo.step(number)
        _check_step(FixedRewardTask(), batch, metrics, trained[-1])
        rounds.append(metrics["sampling_rounds"])
        assert metrics["underfilled_steps"] == 0
        assert metrics["policy_version"] == number
        assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert sum(rounds) > 3, rounds  # a third of the prompts have a signal: some steps resample
    assert len(trained) == 3


def test_in_process_step_without_signal_stops_at_the_bound(
    arithmetic_data, tiny_model_dir, monkeypatch, caplog
):
    from llmrl.runtime import grpo_loop as inprocess

    _, manifest = inprocess.prepared_task(arithmetic_data)
    never = FixedRewardTask(informative_every=0)
    monkeypatch.setattr(inprocess, "prepared_task", lambda path: (never, manifest))
    config = _config(arithmetic_data, tiny_model_dir, "advantage.max_resample_rounds=2")
    grpo = inprocess.InProcessGRPO(config)
    with caplog.at_level(logging.WARNING, logger="llmrl.collectors.dynamic_sampling"):
        batch, metrics = grpo.step(1)
    assert metrics["sampling_rounds"] == 3.0  # 1 + max_resample_rounds, then it gave up
    assert batch.batch_size[0] == 3 * PROMPTS * G
    assert metrics["trained_groups"] == 0.0 and metrics["underfilled_steps"] == 1
    assert metrics["dropped_zero_std_groups"] == 3 * PROMPTS
    assert "loss" not in metrics  # nothing to train on
    assert metrics["policy_version"] == 1  # the step still ends with a weight update
    assert "advantage.max_resample_rounds=2" in caplog.text


@pytest.mark.integration
def test_runtime_steps_resample_on_ray(local_ray, arithmetic_data, tiny_model_dir, monkeypatch):
    from llmrl.runtime import GRPORuntime, grpo_runtime, resolve_topology
    from llmrl.runtime.ray_cluster import actor_runtime_env

    _, manifest = grpo_runtime.prepared_task(arithmetic_data)
    task = FixedRewardTask(informative_every=2)
    monkeypatch.setattr(grpo_runtime, "prepared_task", lambda path: (task, manifest))
    # sync: every round of a step at one version; a bound the data order never reaches
    config = _config(arithmetic_data, tiny_model_dir, "advantage.max_resample_rounds=8")
    runtime_env = actor_runtime_env()
    runtime_env["env_vars"]["PYTHONPATH"] = str(REPO)  # the env workers import the task
    runtime = GRPORuntime(config=config, topology=resolve_topology(config), runtime_env=runtime_env)
    try:
        steps = [runtime.step(number) for number in (1, 2)]
    finally:
        runtime.shutdown()
    for number, (batch, metrics) in enumerate(steps, start=1):
        _check_step(task, batch, metrics, None)
        assert metrics["policy_version"] == number and metrics["staleness"] == 0
        assert "loss" in metrics
    rounds = [metrics["sampling_rounds"] for _, metrics in steps]
    assert sum(rounds) > 2, rounds  # half the prompts have a signal: a step resampled
    versions = [set(v) for _, v in runtime.trained_versions]
    assert versions == [{0}, {1}]  # every round of a step drawn with that step's weights
