"""Objectives: the GRPO family and SFT losses, advantage estimators and top-k reward selection.

Layer 2 (policies, envs, objectives): imports layers 0-1, and objectives imports policies.

``GRPOLoss`` (and its variants ``GSPOLoss``, ``CISPOLoss``, which override its one
``policy_gradient`` method) / ``SFTLoss`` score a batch with the actor and call the pure
``grpo_objective`` / ``sft_objective`` on ``[N, L]`` tensors; the advantage estimators
(``MCAdvantage``, ``RLOOAdvantage``, ``ReinforcePlusPlusAdvantage``) and ``TopKRewardSelector``
gather the rows of each sample group (possibly split across calls) before using them.
``build_grpo_loss`` / ``build_advantage`` make the ones a GRPO stage config selects.
"""

from llmrl.objectives.advantage_estimators import ReinforcePlusPlusAdvantage, RLOOAdvantage
from llmrl.objectives.advantages import SCALES, GroupAdvantage, MCAdvantage
from llmrl.objectives.cispo import CISPOLoss, cispo_term
from llmrl.objectives.from_config import (
    ADVANTAGE_ESTIMATORS,
    LOSS_VARIANTS,
    build_advantage,
    build_grpo_loss,
)
from llmrl.objectives.grouping import GroupBuffer
from llmrl.objectives.grpo import MASKING_STRATEGIES, GRPOLoss
from llmrl.objectives.grpo_objective import GRPOLossOutput, grpo_objective
from llmrl.objectives.gspo import GSPOLoss, gspo_term
from llmrl.objectives.policy_gradient import PolicyGradientTerm, clipped_token_term
from llmrl.objectives.sft import LOSS_FUNCTIONS, REDUCTIONS, SFTLoss, SFTLossOutput, sft_objective
from llmrl.objectives.token_level import AGGREGATIONS
from llmrl.objectives.top_k import TopKRewardSelector

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "LOSS_FUNCTIONS",
    "LOSS_VARIANTS",
    "MASKING_STRATEGIES",
    "REDUCTIONS",
    "SCALES",
    "CISPOLoss",
    "GRPOLoss",
    "GRPOLossOutput",
    "GSPOLoss",
    "GroupAdvantage",
    "GroupBuffer",
    "MCAdvantage",
    "PolicyGradientTerm",
    "RLOOAdvantage",
    "ReinforcePlusPlusAdvantage",
    "SFTLoss",
    "SFTLossOutput",
    "TopKRewardSelector",
    "build_advantage",
    "build_grpo_loss",
    "cispo_term",
    "clipped_token_term",
    "grpo_objective",
    "gspo_term",
    "sft_objective",
]
