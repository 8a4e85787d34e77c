"""On-policy distillation: a teacher's per-token log-probs as the advantage of the student's tokens.

The student samples; the teacher scores the student's own tokens (``teacher_log_probs``, one
scoring pass); each trained token ``t`` of row ``i`` then gets the advantage::

    A_it = task_weight * A_i + coeff * (log p_teacher(y_t) - log p_sampler(y_t))

``A_i`` is the estimator's sequence advantage, ``p_sampler`` the engine's sampling log-prob.
The second term is minus the single-sample estimate of the per-token reverse KL
``KL(student || teacher)`` on the student's own sample: the policy gradient raises the tokens
the teacher finds likelier than the student did and lowers the others, a signal on every
token where the task reward gives one per response. It is detached (an advantage, not a loss
to differentiate), and it enters every loss variant where ``A_i`` did: a token-level
advantage is what GSPO-token's ratio takes, and what GRPO's and CISPO's per-token terms
broadcast anyway.

Example (hand-computed): row 0's task advantage 1.0 and two tokens whose teacher/sampler gaps
are ``-0.5`` and ``+1.0``; ``coeff=2``, ``task_weight=0.5``::

    >>> teacher = torch.tensor([[-1.5, -1.0]])
    >>> sampler = torch.tensor([[-1.0, -2.0]])
    >>> mask = torch.tensor([[True, True]])
    >>> distillation_advantage(torch.tensor([1.0]), teacher, sampler, mask, 2.0, 0.5).tolist()
    [[-0.5, 2.5]]
"""

from __future__ import annotations

import torch

TEACHER_LOG_PROBS = "teacher_log_probs"
"""Where the teacher's log-probs of the batch's tokens are (:mod:`llmrl.scorers.teacher`)."""


def distillation_advantage(
    advantage: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    sampling_log_probs: torch.Tensor,
    mask: torch.Tensor,
    coeff: float,
    task_weight: float,
) -> torch.Tensor:
    """``[N, L]``: ``task_weight * A_i + coeff * (teacher - sampler)`` on the ``mask``ed
    tokens, 0 elsewhere (detached).

    Args:
        advantage: ``[N]`` (or ``[N, 1]``), the estimator's advantage per sequence.
        teacher_log_probs, sampling_log_probs: ``[N, L]`` over the loss's layout.
        mask: ``[N, L]`` bool, the trained tokens.
        coeff: the teacher signal's weight (> 0).
        task_weight: the task advantage's weight (>= 0; 0: pure distillation).
    """
    if coeff <= 0 or task_weight < 0:
        raise ValueError(
            f"distillation needs coeff > 0 and task_weight >= 0, got {coeff} and {task_weight}"
        )
    mask = mask.bool()
    gap = (teacher_log_probs.detach() - sampling_log_probs.detach()).to(teacher_log_probs.dtype)
    column = advantage.detach().reshape(-1, 1).to(gap.dtype)
    per_token = task_weight * column + coeff * gap
    return torch.where(mask, per_token, torch.zeros_like(per_token))


def reverse_kl(
    teacher_log_probs: torch.Tensor, sampling_log_probs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The mean over the ``mask``ed tokens of ``log p_sampler - log p_teacher``: the
    single-sample estimate of ``KL(student || teacher)`` per token (0 without tokens)."""
    mask = mask.bool()
    gap = torch.where(mask, sampling_log_probs - teacher_log_probs, 0.0).detach()
    return gap.sum() / mask.sum().clamp(min=1)
