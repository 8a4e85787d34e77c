"""Topologies the tests build from: the chart's (its values merged as Helm does), the spec's
invalid ones with the message each must fail with, a few named ones for launch manifests, and
the launcher settings a chart release runs with."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from flows.launchers.settings import KubernetesSettings
from llmrl.topology import (
    EnvWorkerSpec,
    InferenceSpec,
    ModelRoleSpec,
    ReferenceSpec,
    SchedulingSpec,
    Topology,
    TrainerSpec,
)
from tests.support.chart import CHART


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` merged into a copy of ``base`` (lists and scalars replace), as Helm does."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def chart_topology(example: str | None = None) -> dict[str, Any]:
    """The chart's default topology, with an example values file merged in."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if example is not None:
        values = merged(values, yaml.safe_load((CHART / "examples" / example).read_text()))
    return values["topology"]


INVALID = [
    pytest.param(
        {"inference": {"backend": "transformers", "tensor_parallel_size": 2}},
        r"inference\.tensor_parallel_size: the transformers backend .* must be 1 \(got 2\)",
        id="transformers-needs-tp1",
    ),
    pytest.param(
        {"inference": {"backend": "transformers", "gpus_per_engine": 2}},
        r"inference\.gpus_per_engine: the transformers backend runs each engine on CPU or one "
        r"GPU; must be 0 or 1 \(got 2\)",
        id="transformers-at-most-1-gpu",
    ),
    pytest.param(
        {"inference": {"backend": "vllm", "tensor_parallel_size": 2, "gpus_per_engine": 1}},
        r"inference\.gpus_per_engine: .* must equal inference\.tensor_parallel_size \(2\), .*"
        r"got 1",
        id="vllm-gpus-equal-tp",
    ),
    pytest.param(
        {"inference": {"backend": "vllm", "tensor_parallel_size": 2, "gpus_per_engine": 0}},
        r"inference\.gpus_per_engine: .* or be 0 with tensor_parallel_size 1 for vLLM's CPU "
        r"build; got 0",
        id="vllm-cpu-engine-not-sharded",
    ),
    pytest.param(
        {"trainer": {"strategy": "single", "gpus": 2}},
        r"trainer\.gpus: strategy 'single' trains in one process on at most 1 GPU \(got 2\)",
        id="single-at-most-1-gpu",
    ),
    pytest.param(
        {"trainer": {"strategy": "single", "gpus": 0, "ranks": 2}},
        r"trainer\.ranks: strategy 'single' trains in one process; must be 1 or left out "
        r"\(got 2\); use strategy 'ddp' or 'fsdp'",
        id="single-is-one-rank",
    ),
    pytest.param(
        {"trainer": {"strategy": "fsdp", "gpus": 1}},
        r"trainer\.gpus: strategy 'fsdp' .* needs at least 2 \(the trainer's world size is 1\); "
        r"set trainer\.gpus >= 2 .*, or trainer\.gpus 0 and trainer\.ranks >= 2 to train on CPU",
        id="fsdp-needs-2-ranks",
    ),
    pytest.param(
        {"trainer": {"strategy": "ddp", "gpus": 0}},
        r"trainer\.gpus: strategy 'ddp' .* needs at least 2 \(the trainer's world size is 1\)",
        id="ddp-needs-2-ranks",
    ),
    pytest.param(
        {"trainer": {"strategy": "ddp", "gpus": 0, "ranks": 1}},
        r"trainer\.ranks: strategy 'ddp' .* needs at least 2 \(the trainer's world size is 1\)",
        id="ddp-needs-2-cpu-ranks",
    ),
    pytest.param(
        {"trainer": {"strategy": "fsdp", "gpus": 2, "ranks": 4}},
        r"trainer\.ranks: each rank of a GPU trainer drives one GPU; must equal trainer\.gpus "
        r"\(2\) or be left out \(got 4\); set trainer\.gpus to 0 for CPU ranks",
        id="one-rank-per-gpu",
    ),
    pytest.param(
        {"reference": {"placement": "dedicated"}},
        r"reference\.gpus: a dedicated reference model runs on its own GPUs; must be > 0",
        id="dedicated-reference-needs-gpus",
    ),
    pytest.param(
        {"reference": {"placement": "with_trainer", "gpus": 1}},
        r"reference\.gpus: only a dedicated reference .* placement 'with_trainer' \(got 1\)",
        id="shared-reference-has-no-gpus",
    ),
    pytest.param(
        {
            "colocated": True,
            "inference": {"engines": 4, "tensor_parallel_size": 2},
            "trainer": {"gpus": 4, "strategy": "fsdp"},
        },
        r"trainer\.gpus: colocated .* must equal inference\.engines \* "
        r"inference\.tensor_parallel_size \(4 x 2 = 8\), got 4",
        id="colocated-gpus-match",
    ),
    pytest.param(
        {"colocated": True, "inference": {"backend": "transformers"}, "trainer": {"gpus": 1}},
        r"colocated: inference and training share GPUs, which needs the vllm backend",
        id="colocated-needs-vllm",
    ),
    pytest.param(
        {
            "colocated": True,
            "inference": {"engines": 1, "gpu_memory_utilization": 1.0},
            "trainer": {"gpus": 1},
        },
        r"inference\.gpu_memory_utilization: colocated engines share their GPUs .* must be < 1",
        id="colocated-leaves-memory",
    ),
    pytest.param(
        {"inference": {"backend": "transformers"}, "weight_transport": "vllm"},
        r"weight_transport: 'vllm' pushes straight into vllm engines; inference\.backend is "
        r"'transformers'",
        id="vllm-transport-needs-vllm-engines",
    ),
    pytest.param(
        {"inference": {"backend": "vllm"}, "weight_transport": "broadcast"},
        r"weight_transport: 'broadcast' sends to transformers engines; for inference\.backend "
        r"'vllm' use 'vllm'",
        id="broadcast-needs-transformers-engines",
    ),
]
"""Invalid topology data and the message (a regex) validation must fail with."""

GPU_NODES = SchedulingSpec(
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
)
CPU_NODES = SchedulingSpec(node_selector={"node-pool": "cpu"})

TOPOLOGIES = {
    "chart-default": Topology.model_validate(chart_topology()),
    "split": Topology(
        inference=InferenceSpec(engines=4, tensor_parallel_size=2, scheduling=GPU_NODES),
        trainer=TrainerSpec(gpus=8, strategy="fsdp", scheduling=GPU_NODES),
        reference=ReferenceSpec(placement="dedicated", gpus=1),
        env_workers=EnvWorkerSpec(count=8, cpus_each=2, memory_gb=4, scheduling=CPU_NODES),
    ),
    "colocated": Topology(
        inference=InferenceSpec(engines=2, tensor_parallel_size=2, gpu_memory_utilization=0.4),
        trainer=TrainerSpec(gpus=4, strategy="fsdp"),
        colocated=True,
    ),
    "cpu": Topology.local_default(),
    "cpu-ddp": Topology.model_validate(chart_topology("cpu-ddp.yaml")),
    "model-roles": Topology(  # a CPU judge, a 1-GPU reward model, a served teacher
        **Topology.local_default().model_dump(exclude={"teacher", "judge", "reward_model"}),
        judge=ModelRoleSpec(model="m", backend="transformers", cpus_per_engine=0.5, memory_gb=2),
        reward_model=ModelRoleSpec(model="rm", gpus_per_engine=1, scheduling=GPU_NODES),
        teacher=ModelRoleSpec(url="http://teacher.llm.svc:8000"),
    ),
}
"""Named topologies the launch manifests are built for."""

SETTINGS = KubernetesSettings(
    namespace="llmrl",
    image="ghcr.io/llmrl/llmrl:0.1.0",
    service_account="llmrl-stages",
    active_deadline_seconds=86400,
    env={"HF_HUB_OFFLINE": "1"},
)
"""The launcher's settings as a chart release runs it: service account, deadline, extra env."""
