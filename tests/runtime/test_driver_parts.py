"""The driver's parts of a GRPO step, built once from the config for the in-process loop and the
runtime (llmrl/runtime/driver_parts.py), and the counts both derive from the config."""

from __future__ import annotations

import pytest

from llmrl.config.grpo import GRPOConfig
from llmrl.objectives.advantages import MCAdvantage
from llmrl.runtime.driver_parts import build_driver_parts
from tests.support.configs import stage_config


@pytest.mark.parametrize(
    ("fields", "turns", "minibatches", "total"),
    [
        # 4 prompts x 4 samples = 16 rows, one pass, 50 steps
        ({}, 16, 1, 50),
        # 16 rows in minibatches of 6: 6 + 6 + 4, three optimizer steps a pass, two passes
        ({"minibatch_size": 6, "updates_per_step": 2, "steps": 10}, 16, 3, 60),
        # 3 x 2 rows, minibatches of 6: exactly one
        ({"prompts_per_step": 3, "num_samples": 2, "minibatch_size": 6, "steps": 7}, 6, 1, 7),
    ],
)
def test_the_step_counts_are_the_configs(fields, turns, minibatches, total):
    config = stage_config(GRPOConfig, "data.path=unused", **fields)
    assert config.turns_per_step == turns
    assert config.minibatches == minibatches
    assert config.total_optimizer_steps == total


def test_the_parts_follow_the_config():
    config = stage_config(
        GRPOConfig,
        "data.path=unused",
        "advantage.max_resample_rounds=2",
        "advantage.drop_zero_std=true",
        "reward_shaping.overlong_buffer.length=4",
        "audit.enabled=false",
    )
    parts = build_driver_parts(config)
    assert isinstance(parts.advantage, MCAdvantage) and parts.advantage.drop_zero_std
    assert parts.sampler.advantage is parts.advantage
    assert parts.sampler.groups == config.prompts_per_step == 4
    assert parts.sampler.max_resample_rounds == 2
    assert parts.shaping is not None and parts.audit is None


def test_no_shaping_and_the_audit_with_the_given_tokenizer():
    config = stage_config(GRPOConfig, "data.path=unused", "audit.enabled=true")
    tokenizer = object()  # the audit keeps it for later decodes; none runs here
    parts = build_driver_parts(config, tokenizer=tokenizer)
    assert parts.shaping is None
    assert parts.audit is not None and parts.audit.tokenizer is tokenizer
