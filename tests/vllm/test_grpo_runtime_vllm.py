"""The GRPO runtime with ``inference.backend: vllm`` on vLLM's CPU build, as
``configs/grpo-vllm-cpu.yaml`` describes it: a vLLM engine actor on Ray, two env workers and two
trainer ranks (DDP over gloo), weights pushed after every step. After each push the engine must
score exactly like the trainer's saved weights."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from llmrl.runtime import GRPORuntime, resolve_topology
from llmrl.runtime.ray_cluster import actor_runtime_env
from tests.support.configs import vllm_cpu_grpo_config
from tests.support.fixed_reward_task import FixedRewardTask
from tests.support.paths import REPO
from tests.vllm.conftest import ATOL, assert_close_rows, hf_log_probs

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("isolated_stage"),
]

PROBE = [1, 9690, 198, 504, 3458, 28, 253, 9516, 30, 216, 33, 34]


def test_grpo_on_a_vllm_cpu_engine_keeps_the_engine_equal_to_the_trainer(
    local_ray,
    arithmetic_data,
    vllm_tiny_dir,
    tmp_path,
    monkeypatch,
):
    from llmrl.models import load_model
    from llmrl.runtime import grpo_runtime

    # every group carries a signal (rewards hash the response), so every step moves the weights
    _, manifest = grpo_runtime.prepared_task(arithmetic_data)
    monkeypatch.setattr(grpo_runtime, "prepared_task", lambda path: (FixedRewardTask(1), manifest))

    config = vllm_cpu_grpo_config(
        arithmetic_data,
        vllm_tiny_dir,  # the shipped config's SmolLM2, shrunk for the test
        "generation.max_new_tokens=8",
        "optimizer.lr=1e-3",
        f"checkpoint.dir={tmp_path / 'checkpoints'}",
        "checkpoint.keep_last=3",
        "prompts_per_step=4",
        "num_samples=2",
        # rank 0 pushes straight into the engine through vLLM's weight-transfer API, the call
        # sequence vLLM's nccl and ipc engines take on GPUs (the shipped config's 'auto' goes
        # through the Ray object store and the inference actor, as the other vLLM runtime
        # tests do)
        "topology.weight_transport=vllm",
    )
    assert config.topology.inference.backend == "vllm"
    assert config.topology.inference.engine_gpus == 0 and config.topology.trainer.world_size == 2
    start = load_model(vllm_tiny_dir, dtype=torch.float32).eval()
    runtime_env = actor_runtime_env()
    runtime_env["env_vars"]["PYTHONPATH"] = str(REPO)  # the env workers import the task
    runtime = GRPORuntime(config=config, topology=resolve_topology(config), runtime_env=runtime_env)
    try:
        import ray

        [engine] = runtime.vllm_engines
        scores = [torch.tensor(ray.get(engine.prompt_log_probs.remote([PROBE]))[0])]
        assert_close_rows([hf_log_probs(start, PROBE)], scores)
        steps = []
        for number in (1, 2, 3):
            _, metrics = runtime.step(number)
            steps.append(metrics)
            saved = Path(runtime.save(number, {}, metrics)) / "model"
            trainer = load_model(saved, dtype=torch.float32).eval()
            assert ray.get(engine.weight_version.remote()) == str(number)
            scores.append(torch.tensor(ray.get(engine.prompt_log_probs.remote([PROBE]))[0]))
            assert_close_rows([hf_log_probs(trainer, PROBE)], scores[-1:])
    finally:
        runtime.shutdown()
    assert [m["policy_version"] for m in steps] == [1, 2, 3]
    assert all(m["response_tokens"] > 0 and "loss" in m for m in steps)
    # the consistency audit on vLLM: the sampled log-probs of every trained token against the
    # trainer ranks' (DDP, one shard each) differ by fp32 rounding only, as the probes above
    # (measured: mean 3.4e-7 - 3.7e-7, max 1.9e-6, KL 2e-13)
    for m in steps:
        assert m["audit/logprob_tokens"] == m["response_tokens"]  # every row trained
        assert m["audit/logprob_gap_max"] <= ATOL
        assert m["audit/logprob_gap_mean"] <= ATOL / 10 and 0 <= m["audit/kl"] <= ATOL**2
        assert m["audit/weight_checksum_mismatches"] == 0
        assert 0 <= m["audit/token_roundtrip_mismatches"] <= 8
    # the pushes carried each distinct tensor once, fp32: the tied head is not sent twice
    element_bytes = 4 * sum(p.numel() for p in start.parameters())
    assert [m["weight_sync_bytes"] for m in steps] == [element_bytes] * 3
    # and each one moved the engine (lr 1e-3 on a random model): no step was a no-op
    for before, after in itertools.pairwise(scores):
        assert (before - after).abs().max() > 1e-3
