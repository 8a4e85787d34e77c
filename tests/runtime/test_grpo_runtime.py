"""The GRPO runtime on a local Ray: the staleness bound of async mode recorded for every
trained sample, and engines and env workers killed mid-step rebuilt while the step completes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmrl.config.grpo import GRPOConfig
from llmrl.runtime import GRPORuntime, resolve_topology
from llmrl.runtime.ray_cluster import actor_runtime_env
from tests.support.configs import tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _config(data: Path, model: Path, *overrides: str, **fields) -> GRPOConfig:
    return tiny_grpo_config(data, model, *overrides, **fields)


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
    runtime = GRPORuntime(
        config=config, topology=resolve_topology(config), runtime_env=actor_runtime_env()
    )
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
    runtime = GRPORuntime(
        config=config, topology=resolve_topology(config), runtime_env=actor_runtime_env()
    )
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


def test_an_engine_on_corrupted_weights_stops_the_run_naming_the_step_and_the_engine(
    local_ray, arithmetic_data, tiny_model_dir, monkeypatch
):
    import ray

    from llmrl.models import load_model
    from llmrl.train.audit import AuditError

    config = _config(arithmetic_data, tiny_model_dir)
    runtime = GRPORuntime(
        config=config, topology=resolve_topology(config), runtime_env=actor_runtime_env()
    )
    collector = runtime.collector
    push = collector.update_policy_weights_
    corrupted = load_model(tiny_model_dir).state_dict()
    corrupted["model.norm.weight"] = corrupted["model.norm.weight"] * 20  # every logit x20

    def push_then_corrupt(weights=None):
        # under the rollouts' lock, as every push: batch 2 is sampled from the corrupted engine
        stats = push(weights)
        engine = collector.inference_actors[0]
        ray.get(engine.load_state_dict.remote(corrupted, version=collector.policy_version))
        return stats

    try:
        _, first = runtime.step(1)
        monkeypatch.setattr(collector, "update_policy_weights_", push_then_corrupt)
        runtime.step(2)  # pushes version 2, then corrupts the engine
        with pytest.raises(AuditError) as caught:
            runtime.step(3)
    finally:
        runtime.shutdown()
    # the engine held the trainer's weights at step 1 (float32: rounding apart)
    assert first["audit/logprob_gap_mean"] < 1e-4 and first["audit/kl"] < 1e-6
    assert first["audit/logprob_tokens"] == first["response_tokens"]
    assert first["audit/weight_checksums_checked"] == 1  # the one engine, after the push
    assert first["audit/weight_checksum_mismatches"] == 0
    assert "audit/token_roundtrip_mismatches" in first
    error = caught.value
    assert type(error) is AuditError  # the rank's error as it raised it, not Ray's wrapper
    assert error.step == 3 and error.engine == 0
    assert str(error).startswith("consistency audit, step 3: engine 0's sampling log-probs")
    assert error.metrics["audit/logprob_gap_mean"] > config.audit.max_logprob_gap_mean
