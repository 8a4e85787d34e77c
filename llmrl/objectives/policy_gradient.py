"""The policy-gradient term of the GRPO family of losses, one function per variant.

:func:`~llmrl.objectives.grpo_objective.grpo_objective` adds the KL and entropy terms, the truncated
importance weight and the aggregation around a *policy-gradient term*: a function of the
current and old log-probs and the advantages that returns each token's loss. GRPO's is
:func:`clipped_token_term` (PPO's clipped surrogate, with DAPO's asymmetric clip); the variants
(:mod:`llmrl.objectives.gspo`, :mod:`llmrl.objectives.cispo`) provide their own, and their loss
classes override :meth:`~llmrl.objectives.GRPOLoss.policy_gradient` to use it.

Every term takes ``[N, L]`` tensors whose invalid positions (``~mask``) hold 0 and returns a
:class:`PolicyGradientTerm`; what it returns at invalid positions is ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PolicyGradientTerm:
    """What a policy-gradient term returns.

    Attributes:
        loss: ``[N, L]`` each token's loss (to minimise), before the truncated importance
            weight and the aggregation.
        clipped: ``[N, L]`` bool, the tokens the variant's clip acted on (the
            ``clip_fraction`` diagnostic; its meaning per variant is in each term's docstring).
    """

    loss: torch.Tensor
    clipped: torch.Tensor


PolicyGradient = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[float, float]],
    PolicyGradientTerm,
]
"""The signature of a policy-gradient term (and of ``GRPOLoss.policy_gradient``):
``(log_probs, old_log_probs, advantage, mask, clip) -> PolicyGradientTerm`` with
``log_probs`` ``[N, L]`` (current, with gradients), ``old_log_probs`` ``[N, L]`` (the ratio's
anchor, detached), ``advantage`` ``[N, 1]`` or, per token, ``[N, L]`` (on-policy distillation,
:mod:`llmrl.objectives.distillation`; detached), ``mask`` ``[N, L]`` bool (the trained
tokens) and ``clip`` ``(eps_low, eps_high)``."""


def clipped_token_term(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    clip: tuple[float, float],
) -> PolicyGradientTerm:
    """GRPO's (PPO's) clipped surrogate per token, ``r_t = exp(log_probs - old_log_probs)``::

        loss_t = -min(r_t * A, clip(r_t, 1 - eps_low, 1 + eps_high) * A)

    ``clipped``: the clipped branch is the one taken and has no gradient (``A > 0`` and
    ``r_t > 1 + eps_high``, or ``A < 0`` and ``r_t < 1 - eps_low``).

    Example:
        term = clipped_token_term(lp, old, adv.unsqueeze(1), mask, (0.2, 0.28))
    """
    eps_low, eps_high = clip
    ratio = (log_probs - old_log_probs).exp()
    bounded = ratio.clamp(1 - eps_low, 1 + eps_high)
    surrogate = torch.minimum(ratio * advantage, bounded * advantage)
    with torch.no_grad():
        clipped = ((advantage > 0) & (ratio > 1 + eps_high)) | (
            (advantage < 0) & (ratio < 1 - eps_low)
        )
    return PolicyGradientTerm(loss=-surrogate, clipped=clipped & mask)
