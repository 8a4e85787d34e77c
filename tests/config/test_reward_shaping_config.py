"""``reward_shaping`` in the GRPO config: off by default, each option as the CLI sets it, and
errors that name the field (the buffer against ``generation.max_new_tokens`` naming both)."""

from __future__ import annotations

import pytest

from llmrl.config.grpo import GRPOConfig
from llmrl.core.config_loading import ConfigError
from llmrl.objectives.reward_shaping import RewardShaper
from tests.support.configs import stage_config


def _config(*overrides: str) -> GRPOConfig:
    return stage_config(GRPOConfig, "data.path=prepared", *overrides)


def _refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as error:
        _config(*overrides)
    return str(error.value)


def test_every_option_is_off_by_default_and_builds_no_shaper():
    shaping = _config().reward_shaping
    assert not shaping.enabled and not shaping.masks
    assert shaping.truncated == "keep" and shaping.overlong_buffer is None
    assert RewardShaper.from_config(_config()) is None


def test_every_option_as_the_cli_sets_it():
    config = _config(
        "generation.max_new_tokens=512",
        "reward_shaping.overlong_buffer={length: 128, penalty: 0.5}",
        "reward_shaping.truncated=penalize",
        "reward_shaping.truncated_penalty=1.0",
        "reward_shaping.length_penalty={coeff: 0.1}",
        "reward_shaping.repetition={ngram: 3, max_ratio: 0.6, action: mask}",
    )
    shaping = config.reward_shaping
    assert (shaping.overlong_buffer.length, shaping.overlong_buffer.penalty) == (128, 0.5)
    assert shaping.length_penalty.coeff == 0.1 and shaping.repetition.ngram == 3
    assert shaping.enabled and shaping.masks  # the repetition filter masks
    shaper = RewardShaper.from_config(config)
    assert shaper is not None and shaper.max_new_tokens == 512


@pytest.mark.parametrize("length", [64, 65])
def test_a_buffer_as_long_as_the_budget_is_refused_naming_both_fields(length):
    message = _refused(
        "generation.max_new_tokens=64", f"reward_shaping.overlong_buffer={{length: {length}}}"
    )
    assert "reward_shaping.overlong_buffer.length" in message
    assert "generation.max_new_tokens (64)" in message
    _config("generation.max_new_tokens=64", "reward_shaping.overlong_buffer={length: 63}")


def test_truncated_penalize_needs_its_penalty_and_only_it_takes_one():
    assert "truncated_penalty" in _refused("reward_shaping.truncated=penalize")
    message = _refused("reward_shaping.truncated=mask", "reward_shaping.truncated_penalty=1")
    assert "truncated_penalty" in message and "'mask'" in message
    assert "truncated" in _refused("reward_shaping.truncated=drop")


def test_the_repetition_filter_needs_a_reward_for_action_reward_and_none_for_mask():
    assert "reward_shaping.repetition.reward" in _refused(
        "reward_shaping.repetition={max_ratio: 0.5}"
    )
    assert "reward_shaping.repetition.reward" in _refused(
        "reward_shaping.repetition={max_ratio: 0.5, action: mask, reward: 0.0}"
    )
    assert "max_ratio" in _refused("reward_shaping.repetition={max_ratio: 1.0, reward: 0.0}")


def test_bounds_and_unknown_fields_are_refused_naming_the_field():
    assert "penalty" in _refused("reward_shaping.overlong_buffer={length: 8, penalty: -1}")
    assert "coeff" in _refused("reward_shaping.length_penalty={coeff: 0}")
    assert "overlong" in _refused("reward_shaping.overlong={length: 8}")
