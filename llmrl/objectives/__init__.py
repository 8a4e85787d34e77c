"""Objectives: the GRPO and SFT losses, group-relative advantages and top-k reward selection.

``GRPOLoss`` / ``SFTLoss`` score a batch with the actor and call the pure ``grpo_objective`` /
``sft_objective`` on ``[N, L]`` tensors; ``MCAdvantage`` and ``TopKRewardSelector`` gather the
rows of each sample group (possibly split across calls) before using them.
"""

from llmrl.objectives.advantages import SCALES, MCAdvantage
from llmrl.objectives.grouping import GroupBuffer
from llmrl.objectives.grpo import MASKING_STRATEGIES, GRPOLoss, GRPOLossOutput, grpo_objective
from llmrl.objectives.sft import LOSS_FUNCTIONS, REDUCTIONS, SFTLoss, SFTLossOutput, sft_objective
from llmrl.objectives.token_level import AGGREGATIONS
from llmrl.objectives.top_k import TopKRewardSelector

__all__ = [
    "AGGREGATIONS",
    "LOSS_FUNCTIONS",
    "MASKING_STRATEGIES",
    "REDUCTIONS",
    "SCALES",
    "GRPOLoss",
    "GRPOLossOutput",
    "GroupBuffer",
    "MCAdvantage",
    "SFTLoss",
    "SFTLossOutput",
    "TopKRewardSelector",
    "grpo_objective",
    "sft_objective",
]
