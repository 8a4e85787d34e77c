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


def test_every_loss_option_is_a_keyword_of_the_loss():
    """A new option is a settings field and a keyword of the same name: nothing maps them."""
    import inspect

    from llmrl.objectives import GRPOLoss

    keywords = set(inspect.signature(GRPOLoss.__init__).parameters)
    assert set(GRPOLossSettings.model_fields) - {"variant"} <= keywords


def test_the_loss_gets_every_option_of_its_section(tiny, tokenizer):
    from llmrl.objectives import CISPOLoss, build_grpo_loss
    from llmrl.policies import TransformersWrapper

    config = load_config(
        GRPOConfig,
        None,
        [
            "data.path=x",
            "generation.max_new_tokens=96",
            "loss.variant=cispo",
            "loss.clip_epsilon=[1.0, 0.28]",
            "loss.entropy_coeff=0.01",
            "loss.kl_to_inference_coeff=0.02",
            "loss.aggregation=sum_norm",
            "loss.masking_strategy=rlhf",
            "loss.mismatch={level: sequence, mode: mask, threshold: 3.0}",
        ],
    )
    loss = build_grpo_loss(TransformersWrapper(tiny, tokenizer), config)
    assert type(loss) is CISPOLoss
    assert loss.clip_epsilon == (1.0, 0.28)
    assert (loss.entropy_coeff, loss.kl_to_inference_coeff, loss.kl_to_ref_coeff) == (0.01, 0.02, 0)
    assert (loss.aggregation, loss.max_length_norm, loss.masking_strategy) == (
        "sum_norm",
        96,
        "rlhf",
    )
    assert (loss.mismatch.level, loss.mismatch.mode, loss.mismatch.threshold) == (
        "sequence",
        "mask",
        3.0,
    )
    assert loss.tis_cap is None
