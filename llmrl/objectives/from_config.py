"""The GRPO stage's loss and advantage estimator, built from its config: the one place that
maps ``loss.variant`` and ``advantage.estimator`` (:mod:`llmrl.config.grpo`) to classes.

Example:
    loss = build_grpo_loss(actor, config)      # GRPOLoss, GSPOLoss or CISPOLoss
    advantage = build_advantage(config)        # MCAdvantage, RLOOAdvantage, ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llmrl.objectives.advantage_estimators import (
    ReferenceScorer,
    ReinforcePlusPlusAdvantage,
    RLOOAdvantage,
)
from llmrl.objectives.advantages import GroupAdvantage, MCAdvantage
from llmrl.objectives.cispo import CISPOLoss
from llmrl.objectives.grpo import GRPOLoss
from llmrl.objectives.gspo import GSPOLoss

if TYPE_CHECKING:
    from llmrl.config.grpo import GRPOConfig
    from llmrl.policies import LLMWrapperBase

LOSS_VARIANTS: dict[str, type[GRPOLoss]] = {
    "grpo": GRPOLoss,
    "gspo": GSPOLoss,
    "cispo": CISPOLoss,
}
"""``loss.variant`` -> the loss class."""

ADVANTAGE_ESTIMATORS: dict[str, type[GroupAdvantage]] = {
    "grpo": MCAdvantage,
    "rloo": RLOOAdvantage,
    "reinforce_pp": ReinforcePlusPlusAdvantage,
}
"""``advantage.estimator`` -> the estimator class."""


def build_grpo_loss(actor: LLMWrapperBase, config: GRPOConfig) -> GRPOLoss:
    """The loss class ``loss.variant`` selects, over ``actor``, with the section's options
    (:meth:`GRPOLoss.from_settings`)."""
    loss = config.loss
    return LOSS_VARIANTS[loss.variant].from_settings(actor, loss, config.generation.max_new_tokens)


def build_advantage(
    config: GRPOConfig, reference: ReferenceScorer | None = None, **options: Any
) -> GroupAdvantage:
    """The estimator ``config.advantage`` selects, for groups of ``config.num_samples``.

    Args:
        config: the stage config.
        reference: REINFORCE++'s reference scorer (used only with ``kl_in_reward_coeff > 0``).
        options: further :class:`~llmrl.objectives.advantages.GroupAdvantage` arguments
            (``trajectory_key``, ``group_key``...).
    """
    settings = config.advantage
    if settings.estimator == "grpo":
        options["scale"] = settings.scale
    elif settings.estimator == "reinforce_pp":
        options.update(kl_coeff=settings.kl_in_reward_coeff, reference=reference)
    return ADVANTAGE_ESTIMATORS[settings.estimator](
        config.num_samples, drop_zero_std=settings.drop_zero_std, **options
    )
