"""GSPO (Group Sequence Policy Optimization, Zheng et al. 2025): one importance ratio per
sequence, clipped per sequence.

The ratio of sequence ``i`` is the geometric mean of its tokens' ratios, i.e. the exponential of
its length-normalised log-ratio over the trained tokens ``T_i``::

    s_i = exp( (1 / |T_i|) * sum_{t in T_i} (log pi_t - log pi_old_t) )

and every token of the sequence gets PPO's clipped surrogate of that ratio. This module uses
the paper's **GSPO-token** form: token ``t``'s ratio is ``sg[s_i] * pi_t / sg[pi_t]``, equal to
``s_i`` in value, whose gradient flows through the token's own log-prob only::

    loss_t = -min(s_it * A_i, clip(s_it, 1 - eps_low, 1 + eps_high) * A_i),
    s_it = sg[s_i] * exp(log pi_t - sg[log pi_t])
    d loss_t / d log pi_t = -A_i * s_i   (0 when the sequence is clipped)

With one advantage per sequence (what :class:`~llmrl.objectives.GRPOLoss` reads) this has the
value and the gradient of the sequence form ``-min(s_i A_i, clip(s_i) A_i)`` (gradient through
the mean log-ratio) under every aggregation: differentiating ``s_i`` through the mean gives
each of its ``|T_i|`` tokens ``s_i / |T_i|``, and the sequence's loss counts ``|T_i|`` times in
a token sum. The paper averages over sequences: ``aggregation="prompt_mean"``. Its clip range is
much narrower than GRPO's (a sequence ratio moves less than a token's; the paper uses
``(3e-4, 4e-4)``).

Per-token advantages ``A_it`` (on-policy distillation, :mod:`llmrl.objectives.distillation`)
go into the same per-token surrogate: ``loss_t = -min(s_it A_it, clip(s_it) A_it)``. This is
the paper's reason for the token form (its GSPO-token "allows token-wise advantage
customization"), and it is sound: the importance weight stays the sequence's ``s_i`` (the
sequence is what the sampler drew, and ``s_i`` is the length-normalised likelihood ratio of
it), while each token's gradient is weighted by its own advantage,
``d loss_t / d log pi_t = -A_it * s_i``, which at ``s_i = 1`` is REINFORCE on the per-token
advantage, as GRPO and CISPO give. The clip decision is per token: ``s_i`` is shared, but
which side of the clip cuts depends on the sign of ``A_it``, so a token the teacher favours
(``A_it > 0``) stops at ``s_i > 1 + eps_high`` and one it disfavours at ``s_i < 1 - eps_low``.
With ``A_it`` constant over the sequence this is the sequence form above; with varying
``A_it`` there is no sequence form, the token form is the definition.
"""

from __future__ import annotations

import torch

from llmrl.objectives.grpo import GRPOLoss
from llmrl.objectives.policy_gradient import PolicyGradientTerm


def gspo_term(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    clip: tuple[float, float],
) -> PolicyGradientTerm:
    """GSPO-token's loss per token (see the module docstring); ``clipped``: every token of a
    sequence whose clipped branch is taken (``A > 0`` and ``s_i > 1 + eps_high``, or ``A < 0``
    and ``s_i < 1 - eps_low``). A sequence without trained tokens has ``s_i = 1``.

    Example:
        term = gspo_term(lp, old, adv.unsqueeze(1), mask, (3e-4, 4e-4))
    """
    eps_low, eps_high = clip
    with torch.no_grad():
        log_ratio = torch.where(mask, log_probs - old_log_probs, torch.zeros_like(log_probs))
        tokens = mask.sum(1, keepdim=True).clamp(min=1)
        sequence_ratio = (log_ratio.sum(1, keepdim=True) / tokens).exp()  # [N, 1]
        clipped = ((advantage > 0) & (sequence_ratio > 1 + eps_high)) | (
            (advantage < 0) & (sequence_ratio < 1 - eps_low)
        )
    ratio = sequence_ratio * (log_probs - log_probs.detach()).exp()  # s_i, gradient per token
    bounded = ratio.clamp(1 - eps_low, 1 + eps_high)
    surrogate = torch.minimum(ratio * advantage, bounded * advantage)
    return PolicyGradientTerm(loss=-surrogate, clipped=clipped.expand_as(mask) & mask)


class GSPOLoss(GRPOLoss):
    """:class:`~llmrl.objectives.GRPOLoss` with GSPO's sequence-level ratio and clip
    (:func:`gspo_term`); every other option (KL, entropy, TIS, aggregation, masking) is
    GRPOLoss's.

    Example:
        loss = GSPOLoss(policy, clip_epsilon=(3e-4, 4e-4), aggregation="prompt_mean")
        loss(batch).loss.backward()
    """

    policy_gradient = staticmethod(gspo_term)
    """GSPO-token's per-token loss (:func:`gspo_term`), in place of GRPO's clipped token ratio."""
