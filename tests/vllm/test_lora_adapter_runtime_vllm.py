"""The GRPO runtime with LoRA and ``lora.sync: adapter`` on vLLM's CPU build: the engine loads
the base once, every push carries the adapter alone (a LoRA request per version), the engine
samples like the trainer ranks score, and it holds the adapter rank 0 sent."""

from __future__ import annotations

import pytest
import ray

from llmrl.runtime import GRPORuntime, resolve_topology
from llmrl.runtime.ray_cluster import actor_runtime_env
from tests.support.configs import vllm_cpu_grpo_config
from tests.support.fixed_reward_task import FixedRewardTask
from tests.support.paths import REPO
from tests.vllm.conftest import ATOL

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("isolated_stage"),
]


def test_adapter_pushes_into_a_vllm_cpu_engine_keep_it_equal_to_the_trainer(
    local_ray, arithmetic_data, vllm_tiny_dir, tiny_hf, tmp_path, monkeypatch
):
    from llmrl.runtime import grpo_runtime

    # every group carries a signal (rewards hash the response), so every step moves the adapter
    _, manifest = grpo_runtime.prepared_task(arithmetic_data)
    monkeypatch.setattr(grpo_runtime, "prepared_task", lambda path: (FixedRewardTask(1), manifest))
    config = vllm_cpu_grpo_config(
        arithmetic_data,
        vllm_tiny_dir,
        "generation.max_new_tokens=8",
        "optimizer.lr=1e-2",
        "lora.enabled=true",
        "lora.r=8",
        f"checkpoint.dir={tmp_path / 'checkpoints'}",
        "prompts_per_step=4",
        "num_samples=2",
    )
    assert config.lora.pushes_adapter
    runtime_env = actor_runtime_env()
    runtime_env["env_vars"]["PYTHONPATH"] = str(REPO)  # the env workers import the task
    runtime = GRPORuntime(config=config, topology=resolve_topology(config), runtime_env=runtime_env)
    try:
        [engine] = runtime.vllm_engines
        steps = [runtime.step(number)[1] for number in (1, 2)]
        version = ray.get(engine.weight_version.remote())
        pushes = list(runtime.collector.weight_updater.history)
    finally:
        runtime.shutdown()
    assert version == "2" and [m["policy_version"] for m in steps] == [1, 2]
    # q/k/v/o at rank 8 over 2 layers of hidden 128 (1 KV head of 64), float32
    hidden, kv = 128, 64
    per_layer = 8 * ((hidden + hidden) * 2 + (hidden + kv) * 2)
    adapter = 4 * tiny_hf.config.num_hidden_layers * per_layer
    merged = 4 * sum(p.numel() for p in tiny_hf.parameters())
    for m, push in zip(steps, pushes, strict=True):
        assert m["weight_sync_bytes"] == adapter and m["weight_sync_merged_bytes"] == merged
        assert push.engine_checksums == (push.checksum,), "the engine verified the adapter"
        assert m["audit/weight_checksum_mismatches"] == 0
        # the sampled log-probs against the trainer ranks' (fp32 rounding, as the base's)
        assert m["audit/logprob_gap_max"] <= ATOL
