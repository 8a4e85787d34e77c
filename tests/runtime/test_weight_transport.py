"""``topology.weight_transport: broadcast`` in the GRPO runtime: trainer rank 0 sends its weights
to the inference actors in buckets over gloo after every step, and after each push every
engine holds exactly what rank 0 sent (the checksums agree)."""

from __future__ import annotations

import pytest

from llmrl.config.grpo import GRPOConfig
from llmrl.runtime import GRPORuntime
from llmrl.runtime.ray_cluster import actor_runtime_env
from llmrl.topology import Topology
from tests.support.configs import stage_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_broadcast_transport_carries_every_push_of_a_run(
    local_ray, arithmetic_data, tiny_model_dir, tiny
):
    config = stage_config(
        GRPOConfig,
        f"data.path={arithmetic_data}",
        f"model.name={tiny_model_dir}",
        "generation.max_new_tokens=6",
        "runtime.torch_threads=1",
        prompts_per_step=2,
        num_samples=2,
    )
    topology = Topology.local_default().model_copy(update={"weight_transport": "broadcast"})
    runtime = GRPORuntime(config=config, topology=topology, runtime_env=actor_runtime_env())
    try:
        steps = [runtime.step(number)[1] for number in (1, 2)]
        pushes = list(runtime.collector.weight_updater.history)
    finally:
        runtime.shutdown()
    assert [m["policy_version"] for m in steps] == [1, 2]
    assert [stats.version for stats in pushes] == [1, 2]
    for stats in pushes:
        assert len(stats.checksum) == 64 and stats.engine_checksums == (stats.checksum,)
    # the stream holds each distinct tensor once (the tied embedding once), float32
    assert [m["weight_sync_bytes"] for m in steps] == [
        4 * sum(p.numel() for p in tiny.parameters())
    ] * 2
