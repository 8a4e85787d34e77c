"""`build_grpo_loss` / `build_advantage`: every name the GRPO config accepts maps to a class,
and each estimator gets its own options from the config."""

from __future__ import annotations

import typing

from llmrl.config import load_config
from llmrl.config.grpo import AdvantageSettings, GRPOConfig, GRPOLossSettings
from llmrl.objectives import (
    ADVANTAGE_ESTIMATORS,
    LOSS_VARIANTS,
    ReinforcePlusPlusAdvantage,
    RLOOAdvantage,
    build_advantage,
)


def _choices(model: type, field: str) -> set[str]:
    return set(typing.get_args(model.model_fields[field].annotation))


def test_every_config_choice_has_a_class():
    assert set(LOSS_VARIANTS) == _choices(GRPOLossSettings, "variant")
    assert set(ADVANTAGE_ESTIMATORS) == _choices(AdvantageSettings, "estimator")


def test_estimators_get_their_options():
    def reference(td):
        return td

    config = load_config(
        GRPOConfig,
        None,
        [
            "data.path=x",
            "num_samples=3",
            "advantage.estimator=reinforce_pp",
            "advantage.kl_in_reward_coeff=0.05",
            "advantage.drop_zero_std=true",
            "reference=true",
        ],
    )
    built = build_advantage(config, reference=reference, trajectory_key=None)
    assert type(built) is ReinforcePlusPlusAdvantage
    assert (built.num_samples, built.kl_coeff, built.drop_zero_std) == (3, 0.05, True)
    assert built.reference is reference
    rloo = build_advantage(
        load_config(GRPOConfig, None, ["data.path=x", "advantage.estimator=rloo"]),
        reference=reference,  # ignored: RLOO has no KL in the reward
    )
    assert type(rloo) is RLOOAdvantage and rloo.num_samples == 4
