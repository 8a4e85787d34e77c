"""CISPO (Clipped IS-weight Policy Optimization, MiniMax-M1, 2025): REINFORCE weighted by a
clipped, detached importance ratio, so that no token's gradient is cut off by the clip.

Per trained token, ``r_t = exp(log pi_t - log pi_old_t)``::

    loss_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] * A * log pi_t
    d loss_t / d log pi_t = -clip(r_t, 1 - eps_low, 1 + eps_high) * A

PPO's clip zeroes the gradient of a token whose ratio left the range (on the side that matters);
CISPO only bounds the token's weight. The loss *value* is a REINFORCE surrogate (it holds
``log pi_t``, so it is not comparable with GRPO's): only its gradient matters. The paper
averages over all tokens of the batch (``aggregation="token_mean"``, the default) and bounds
the weight from above only: ``clip_epsilon=(1.0, eps_high)`` (a lower bound of 0).
"""

from __future__ import annotations

import torch

from llmrl.objectives.grpo import GRPOLoss
from llmrl.objectives.policy_gradient import PolicyGradientTerm


def cispo_term(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    clip: tuple[float, float],
) -> PolicyGradientTerm:
    """CISPO's loss per token (see the module docstring); ``clipped``: the tokens whose weight
    the clip changed (``r_t > 1 + eps_high`` or ``r_t < 1 - eps_low``, whatever ``A``); they
    keep their gradient, with the bounded weight.

    Example:
        term = cispo_term(lp, old, adv.unsqueeze(1), mask, (1.0, 0.28))
    """
    eps_low, eps_high = clip
    with torch.no_grad():
        ratio = (log_probs - old_log_probs).exp()
        weight = ratio.clamp(1 - eps_low, 1 + eps_high)
        clipped = (ratio > 1 + eps_high) | (ratio < 1 - eps_low)
    return PolicyGradientTerm(loss=-weight * advantage * log_probs, clipped=clipped & mask)


class CISPOLoss(GRPOLoss):
    """:class:`~llmrl.objectives.GRPOLoss` with CISPO's clipped importance weight
    (:func:`cispo_term`); every other option (KL, entropy, TIS, aggregation, masking) is
    GRPOLoss's.

    Example:
        loss = CISPOLoss(policy, clip_epsilon=(1.0, 0.28))
        loss(batch).loss.backward()
    """

    policy_gradient = staticmethod(cispo_term)
    """CISPO's per-token loss (:func:`cispo_term`), in place of GRPO's clipped token ratio."""
