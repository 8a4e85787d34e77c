"""The GRPO runtime with LoRA and ``lora.sync: adapter`` on transformers engines: every push
carries the adapter alone (bytes hand-computed from the rank and the layer shapes, against the
merged model's), the engines sample like the trainer scores, and a resumed run's engines serve
the checkpoint's adapter under its version."""

from __future__ import annotations

import pytest
import ray
from safetensors.torch import load_file

from llmrl.core.weights_checksum import weights_checksum
from llmrl.runtime import GRPORuntime, resolve_topology
from llmrl.runtime.ray_cluster import actor_runtime_env
from llmrl.train.checkpoint import read_train_state
from tests.support.configs import tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The audit compares the engines' sampling log-probs with the trainer's scoring of the same
# tokens: the same peft layers in float32, a KV-cached decode against one forward over the
# sequence, so they differ by summation order only (~1e-7 per logit through 2 layers; measured
# 9.5e-7 and 1.9e-6 at steps 1 and 2). A wrong adapter shows in the checksums the engines
# return, which the audit compares exactly.
GAP = 1e-4


def adapter_bytes(config, r: int) -> int:
    """q/k/v/o adapters of every layer, float32: A is r x in, B is out x r."""
    hidden, head = config.hidden_size, config.hidden_size // config.num_attention_heads
    kv = config.num_key_value_heads * head
    per_layer = sum(
        r * (fan_in + fan_out)
        for fan_in, fan_out in ((hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden))
    )
    return 4 * config.num_hidden_layers * per_layer


def test_adapter_pushes_carry_the_adapter_alone_and_survive_a_resume(
    local_ray, arithmetic_data, tiny_model_dir, tiny, tmp_path
):
    config = tiny_grpo_config(
        arithmetic_data,
        tiny_model_dir,
        "lora.enabled=true",
        "lora.r=4",
        "optimizer.lr=1e-2",
        f"checkpoint.dir={tmp_path / 'checkpoints'}",
    )
    assert config.lora.pushes_adapter
    topology = resolve_topology(config)  # the local default: transformers engines
    assert topology.inference.backend == "transformers"
    runtime = GRPORuntime(config=config, topology=topology, runtime_env=actor_runtime_env())
    try:
        steps = [runtime.step(number)[1] for number in (1, 2)]
        saved = runtime.save(2, {}, steps[-1])
    finally:
        runtime.shutdown()
    merged = 4 * sum(p.numel() for p in tiny.parameters())  # the tied head once
    for m in steps:
        assert m["weight_sync_bytes"] == adapter_bytes(tiny.config, 4)
        assert m["weight_sync_merged_bytes"] == merged > 20 * m["weight_sync_bytes"]
        assert m["audit/weight_checksum_mismatches"] == 0 and m["audit/weight_checksums_checked"]
        assert m["audit/logprob_gap_max"] <= GAP, "the engines serve the trainer's adapter"
    assert [m["policy_version"] for m in steps] == [1, 2]

    state = read_train_state(saved).extra
    resumed = GRPORuntime(
        config=config,
        topology=topology,
        resume_from=saved,
        resume_state=state,
        runtime_env=actor_runtime_env(),
    )
    try:
        [restore] = resumed.collector.weight_updater.history
        versions = ray.get([a.info.remote() for a in resumed.collector.inference_actors])
        _, third = resumed.step(3)
    finally:
        resumed.shutdown()
    saved_adapter = load_file(f"{saved}/adapter/adapter_model.safetensors")
    assert restore.version == 2 and restore.bytes == adapter_bytes(tiny.config, 4)
    assert set(restore.engine_checksums) == {weights_checksum(saved_adapter)}, "the checkpoint's"
    assert [v["version"] for v in versions] == [2] * len(versions)
    assert third["policy_version"] == 3 and third["audit/logprob_gap_max"] <= GAP


def test_merged_sync_still_pushes_the_whole_merged_model(
    local_ray, arithmetic_data, tiny_model_dir, tiny
):
    config = tiny_grpo_config(
        arithmetic_data,
        tiny_model_dir,
        "lora.enabled=true",
        "lora.r=4",
        "lora.sync=merged",
        "optimizer.lr=1e-2",
    )
    assert not config.lora.pushes_adapter
    topology = resolve_topology(config)
    runtime = GRPORuntime(config=config, topology=topology, runtime_env=actor_runtime_env())
    try:
        steps = [runtime.step(number)[1] for number in (1, 2)]
    finally:
        runtime.shutdown()
    merged = 4 * sum(p.numel() for p in tiny.parameters())  # float32, the tied head once
    for m in steps:
        assert m["weight_sync_bytes"] == merged and "weight_sync_merged_bytes" not in m
        assert m["audit/weight_checksum_mismatches"] == 0 and m["audit/weight_checksums_checked"]
        # merged weights: W + scale * B @ A rounded once to float32, against the trainer's
        # unmerged peft forward: a few ulps per logit, far below what a stale push would move
        assert m["audit/logprob_gap_max"] <= GAP, "the engines serve the merged trainer"
    assert [m["policy_version"] for m in steps] == [1, 2]
