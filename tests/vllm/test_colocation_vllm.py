"""On vLLM's CPU build (no sleep mode), the GRPO runtime refuses the colocated layout (the
chart's one-node example) before it places or starts anything, saying why and what to set."""

from __future__ import annotations

import pytest

from llmrl.core.config_loading import ConfigError
from llmrl.runtime import GRPORuntime, grpo_runtime
from llmrl.runtime.colocation import sleep_mode_problem
from llmrl.topology import Topology
from tests.support.configs import tiny_grpo_config
from tests.support.topologies import chart_topology

pytestmark = pytest.mark.vllm


def test_vllms_cpu_build_refuses_the_colocated_example_before_any_actor(
    monkeypatch, arithmetic_data, tiny_model_dir
):
    from vllm.platforms import current_platform

    assert current_platform.is_cpu() and not current_platform.is_sleep_mode_available()
    assert sleep_mode_problem() == "vLLM's CPU build has no sleep mode"
    placed: list[Topology] = []
    monkeypatch.setattr(grpo_runtime, "place_on_ray", lambda topology, **_: placed.append(topology))
    topology = Topology.model_validate(chart_topology("single-node-8gpu.yaml"))
    config = tiny_grpo_config(arithmetic_data, tiny_model_dir, prompts_per_step=8)
    with pytest.raises(ConfigError) as caught:
        GRPORuntime(config=config, topology=topology)
    message = str(caught.value)
    assert "topology.colocated: vLLM's CPU build has no sleep mode" in message
    assert "it needs GPUs (vLLM's CUDA build)" in message
    assert "set topology.colocated: false" in message
    assert placed == []
