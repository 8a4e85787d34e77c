"""Partial rollouts in the GRPO runtime on vLLM's CPU build (``configs/grpo-vllm-cpu.yaml``: a
vLLM engine actor, two env workers, two DDP trainer ranks), async: replies sampled a segment at
a time by the engine, carried across batches and weight pushes, trained within the staleness
bound of their oldest token. One engine start (the runtime's); the policy side of the same is
in test_partial_rollouts_vllm.py."""

from __future__ import annotations

import pytest
import torch

from llmrl.runtime import GRPORuntime, resolve_topology
from llmrl.runtime.ray_cluster import actor_runtime_env
from tests.support.configs import vllm_cpu_grpo_config
from tests.support.ending_model import save_ending_model
from tests.support.fixed_reward_task import FixedRewardTask
from tests.support.partial_rollouts import check_partial_rollout_steps
from tests.support.paths import REPO

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("isolated_stage"),
]

MAX_STALENESS = 3
STEPS = 5


def test_replies_on_a_vllm_engine_carry_across_pushes_within_the_bound(
    local_ray, arithmetic_data, tokenizer, tmp_path, monkeypatch
):
    from llmrl.runtime import grpo_runtime

    # every group carries a signal (rewards hash the response), so no group is dropped
    _, manifest = grpo_runtime.prepared_task(arithmetic_data)
    monkeypatch.setattr(grpo_runtime, "prepared_task", lambda path: (FixedRewardTask(1), manifest))
    # replies end with EOS at 15% a token: at a budget of 12, 14% of them reach it
    model = save_ending_model(tmp_path / "ending-model", tokenizer, eos_prob=0.15)
    config = vllm_cpu_grpo_config(
        arithmetic_data,
        model,
        "generation.max_new_tokens=12",
        "optimizer.lr=1e-3",
        "runtime.partial_rollouts=true",
        "runtime.segment_tokens=3",
        f"checkpoint.dir={tmp_path / 'checkpoints'}",
        mode="async",
        max_staleness=MAX_STALENESS,
        prompts_per_step=4,
        num_samples=2,
    )
    runtime_env = actor_runtime_env()
    runtime_env["env_vars"]["PYTHONPATH"] = str(REPO)  # the env workers import the task
    runtime = GRPORuntime(config=config, topology=resolve_topology(config), runtime_env=runtime_env)
    try:
        import ray

        [engine] = runtime.vllm_engines
        steps, engine_versions = [], []
        for number in range(1, STEPS + 1):
            steps.append(runtime.step(number))
            engine_versions.append(ray.get(engine.weight_version.remote()))
        trained_versions = list(runtime.trained_versions)
    finally:
        runtime.shutdown()
    assert config.topology.inference.backend == "vllm"
    assert engine_versions == [str(number) for number in range(1, STEPS + 1)]
    spanning = check_partial_rollout_steps(
        steps, trained_versions, group_size=2, max_staleness=MAX_STALENESS
    )
    assert spanning > 0, "no reply spanned a push"
    last = steps[-1][1]
    assert last["collector/segments"] > STEPS * 2  # several engine calls a batch
    assert all(torch.isfinite(torch.tensor(metrics["loss"])) for _, metrics in steps)
