"""Partial rollouts in the GRPO runtime (transformers engines on a local Ray): replies sampled in
parts, carried across batches and pushes, trained within the staleness bound of their oldest
token (what every backend must show: tests/support/partial_rollouts.py)."""

from __future__ import annotations

import pytest

from llmrl.runtime import GRPORuntime, resolve_topology
from llmrl.runtime.ray_cluster import actor_runtime_env
from tests.support.configs import tiny_grpo_config
from tests.support.ending_model import save_ending_model
from tests.support.partial_rollouts import check_partial_rollout_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_STALENESS = 3


@pytest.fixture(scope="module")
def ending_model_dir(tmp_path_factory, tokenizer):
    """Replies ending with EOS at 15% a token: at a budget of 12, 14% of them reach it."""
    return save_ending_model(tmp_path_factory.mktemp("ending-model"), tokenizer, eos_prob=0.15)


@pytest.mark.parametrize("segment_tokens", [3, None])
def test_replies_carry_across_pushes_within_the_bound_of_their_oldest_token(
    local_ray, arithmetic_data, ending_model_dir, segment_tokens
):
    """Segments of 3 tokens, or none (the engines return as soon as each env worker has the
    groups it needs): either way replies span pushes and every promise holds."""
    config = tiny_grpo_config(
        arithmetic_data,
        ending_model_dir,
        "generation.max_new_tokens=12",
        "runtime.partial_rollouts=true",
        f"runtime.segment_tokens={'null' if segment_tokens is None else segment_tokens}",
        mode="async",
        max_staleness=MAX_STALENESS,
        prompts_per_step=4,
    )
    runtime = GRPORuntime(
        config=config, topology=resolve_topology(config), runtime_env=actor_runtime_env()
    )
    try:
        steps = [runtime.step(number) for number in range(1, 7)]
        params = runtime.runtime_params()
    finally:
        runtime.shutdown()
    assert params["runtime.engine_segment_tokens"] == (segment_tokens or "none")
    spanning = check_partial_rollout_steps(
        steps,
        list(runtime.trained_versions),
        group_size=config.num_samples,
        max_staleness=MAX_STALENESS,
    )
    assert spanning > 0, "no reply spanned a push"
    if segment_tokens is not None:  # 12-token replies in 3-token segments: calls per batch
        assert steps[-1][1]["collector/segments"] > len(steps) * 2
