"""The GRPO runtime on a local Ray: the staleness bound of async mode recorded for every
trained sample, and engines and env workers killed mid-step rebuilt while the step completes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmrl.config.grpo import GRPOConfig
from llmrl.runtime import GRPORuntime, resolve_topology
from llmrl.runtime.ray_cluster import actor_runtime_env
from tests.train.conftest import stage_config

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=70)]


def _config(data: Path, model: Path, *overrides: str, **fields) -> GRPOConfig:
    return stage_config(
        GRPOConfig,
        f"data.path={data}",
        f"model.name={model}",
        "generation.max_new_tokens=6",
        "optimizer.lr=1e-4",
        "runtime.torch_threads=1",
        *overrides,
        **{"prompts_per_step": 2, "num_samples": 2, **fields},
    )


@pytest.mark.parametrize(
    ("mode", "max_staleness", "dtype"), [("async", 1, "float32"), ("sync", 1, "bfloat16")]
)
def test_no_trained_sample_is_older_than_max_staleness(
    local_ray, arithmetic_data, tiny_model_dir, tiny, mode, max_staleness, dtype
):
    config = _config(
        arithmetic_data,
        tiny_model_dir,
        f"model.dtype={dtype}",
        mode=mode,
        max_staleness=max_staleness,
    )
    bound = max_staleness if mode == "async" else 0
    runtime = GRPORuntime(config, resolve_topology(config), runtime_env=actor_runtime_env())
    try:
        steps = [runtime.step(number)[1] for number in range(1, 5)]
    finally:
        runtime.shutdown()
    assert [m["policy_version"] for m in steps] == [1, 2, 3, 4]
    gaps = [
        trainer_version - version
        for trainer_version, versions in runtime.trained_versions
        for version in versions
    ]
    assert len(gaps) == 4 * 4  # every sample of every step, 2 prompts x 2
    assert [t for t, _ in runtime.trained_versions] == [0, 1, 2, 3]
    assert min(gaps) == 0 and max(gaps) == bound, gaps
    assert [m["staleness"] for m in steps][1:] == [bound] * 3  # overlap from the 2nd step on
    # every push carries each distinct tensor once (tied embeddings once), in model.dtype: a
    # bfloat16 run pushes its float32 masters cast, 2 bytes an element
    element_bytes = torch.finfo(getattr(torch, dtype)).bits // 8
    pushed = element_bytes * sum(p.numel() for p in tiny.parameters())
    assert [m["weight_sync_bytes"] for m in steps] == [pushed] * 4
    assert all(m["peak_memory_mb"] > 0 for m in steps)


def test_a_killed_engine_and_env_worker_are_rebuilt_and_the_step_completes(
    local_ray, arithmetic_data, tiny_model_dir
):
    import ray

    config = _config(arithmetic_data, tiny_model_dir)
    runtime = GRPORuntime(config, resolve_topology(config), runtime_env=actor_runtime_env())
    try:
        runtime.step(1)
        # sync mode: batch 2 is being collected right after the push of version 1; the deaths
        # are found by that collection, or by the next push (the engine) or batch (the worker)
        engine, worker = runtime.collector.inference_actors[0], runtime.collector.env_workers[1]
        ray.kill(engine)
        ray.kill(worker)
        steps = [runtime.step(2)[1], runtime.step(3)[1]]
        rebuilt = runtime.collector.inference_actors[0]
        info = ray.get(rebuilt.info.remote())
    finally:
        runtime.shutdown()
    assert rebuilt != engine
    assert steps[0]["collector/inference_actor_restarts"] == 1  # by step 2's push at the latest
    assert steps[1]["collector/env_worker_restarts"] == 1
    assert [m["policy_version"] for m in steps] == [2, 3]
    assert info["version"] == 3  # the rebuilt engine got every push since
    assert all(m["response_tokens"] > 0 for m in steps)
