"""On-policy distillation: a teacher's per-token log-probs as the advantage of the student's tokens.

The student samples; the teacher scores the student's own tokens (``teacher_log_probs``, one
scoring pass by ``topology.teacher``, :class:`~llmrl.scorers.teacher.TeacherScorer`); each
trained token ``t`` of row ``i`` then gets the advantage::

    A_it = task_weight * A_i + coeff * (log p_teacher(y_t) - log p_sampler(y_t))

``A_i`` is the estimator's sequence advantage, ``p_sampler`` the engine's sampling log-prob.
The second term is minus the single-sample estimate of the per-token reverse KL
``KL(student || teacher)`` on the student's own sample: the policy gradient raises the tokens
the teacher finds likelier than the student did and lowers the others, a signal on every
token where the task reward gives one per response. It is detached (an advantage, not a loss
to differentiate), and it enters every loss variant where ``A_i`` did: GRPO's and CISPO's
per-token terms take it as they broadcast ``A_i``, GSPO through its token form
(:mod:`llmrl.objectives.gspo`). Untrained positions (the prompt under ``masking_strategy:
sft``, padding) get 0.

Example (hand-computed): row 0's task advantage 1.0 and two tokens whose teacher/sampler gaps
are ``-0.5`` and ``+1.0``; ``coeff=2``, ``task_weight=0.5``::

    >>> teacher = torch.tensor([[-1.5, -1.0]])
    >>> sampler = torch.tensor([[-1.0, -2.0]])
    >>> mask = torch.tensor([[True, True]])
    >>> signal = teacher_signal(
    ...     torch.tensor([1.0]), teacher, sampler, mask, coeff=2.0, task_weight=0.5
    ... )
    >>> signal.advantage.tolist()
    [[-0.5, 2.5]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from llmrl.objectives.token_level import align_to_layout, field_rows, masked_mean
from llmrl.policies.policy_inputs import InputKeyError

if TYPE_CHECKING:
    from llmrl.data import Masks

TEACHER_LOG_PROBS = "teacher_log_probs"
"""Where the teacher's log-probs of the batch's tokens are (:mod:`llmrl.scorers.teacher`)."""


@dataclass(frozen=True)
class TeacherSignal:
    """The per-token advantage of a distilled batch and what the step logs of it.

    Attributes:
        advantage: ``[N, L]`` each trained token's advantage, 0 elsewhere (detached).
        reverse_kl: the mean over the trained tokens of ``log p_sampler - log p_teacher``.
        teacher_logprob_mean: the mean over the trained tokens of ``log p_teacher``.
        teacher_share: ``sum |coeff * gap| / (sum |coeff * gap| + sum |task_weight * A_i|)``
            over the trained tokens: how much of the advantage is the teacher's (1: pure
            distillation; 0 when every term is 0).
    """

    advantage: torch.Tensor
    reverse_kl: torch.Tensor
    teacher_logprob_mean: torch.Tensor
    teacher_share: torch.Tensor


def teacher_signal(
    advantage: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    sampling_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    coeff: float,
    task_weight: float,
) -> TeacherSignal:
    """Each trained token's advantage ``task_weight * A_i + coeff * (teacher - sampler)``
    (0 on the other positions; detached) and its diagnostics.

    Args:
        advantage: ``[N]`` (or ``[N, 1]``), the estimator's advantage per sequence.
        teacher_log_probs, sampling_log_probs: ``[N, L]`` over the loss's layout.
        mask: ``[N, L]`` bool, the trained tokens.
        coeff: the teacher signal's weight (> 0).
        task_weight: the task advantage's weight (>= 0; 0: pure distillation).
    """
    mask = mask.bool()
    task, teacher = _parts(advantage, teacher_log_probs, sampling_log_probs, coeff, task_weight)
    zeros = torch.zeros_like(teacher)
    teacher_size = torch.where(mask, teacher.abs(), zeros).sum()
    task_size = torch.where(mask, task.abs().expand_as(teacher), zeros).sum()
    total = teacher_size + task_size
    return TeacherSignal(
        advantage=torch.where(mask, task + teacher, zeros),
        reverse_kl=reverse_kl(teacher_log_probs, sampling_log_probs, mask),
        teacher_logprob_mean=masked_mean(teacher_log_probs.detach(), mask),
        teacher_share=torch.where(total > 0, teacher_size / total.clamp(min=1e-30), 0.0),
    )


def _parts(
    advantage: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    sampling_log_probs: torch.Tensor,
    coeff: float,
    task_weight: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The task's ``[N, 1]`` and the teacher's ``[N, L]`` parts of the advantage, detached."""
    if coeff <= 0 or task_weight < 0:
        raise ValueError(
            f"distillation needs coeff > 0 and task_weight >= 0, got {coeff} and {task_weight}"
        )
    if advantage.numel() != teacher_log_probs.shape[0]:
        raise ValueError(
            f"expected one advantage per row ({teacher_log_probs.shape[0]}), got "
            f"{list(advantage.shape)}"
        )
    gap = (teacher_log_probs.detach() - sampling_log_probs.detach()).to(teacher_log_probs.dtype)
    column = advantage.detach().reshape(-1, 1).to(gap.dtype)
    return task_weight * column, coeff * gap


def reverse_kl(
    teacher_log_probs: torch.Tensor, sampling_log_probs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The mean over the ``mask``ed tokens of ``log p_sampler - log p_teacher``: the
    single-sample estimate of ``KL(student || teacher)`` per token (0 without tokens)."""
    return masked_mean((sampling_log_probs - teacher_log_probs).detach(), mask.bool())


def require_teacher_log_probs(td: TensorDictBase) -> None:
    """Refuse a batch without ``teacher_log_probs``, naming the key and what writes it."""
    if td.get(TEACHER_LOG_PROBS, None) is None:
        present = sorted(td.keys())
        raise InputKeyError(
            f"loss.distillation needs the batch's {TEACHER_LOG_PROBS!r}: the teacher's "
            "log-probs of the sampled tokens, written before the trainer by the teacher role "
            f"(topology.teacher, TeacherScorer); keys present: {present}"
        )


def aligned_teacher_log_probs(
    td: TensorDictBase,
    values_masks: Masks | None,
    layout: Masks,
    mask: torch.Tensor,
    log_probs_key: Any = "log_probs",
) -> torch.Tensor:
    """The batch's ``teacher_log_probs`` laid over the loss's ``layout`` (``[N, L]``).

    Refuses, naming the row, a teacher whose response log-probs do not count as many tokens
    as the sampler's (``log_probs_key``), and one without a value on a trained position (a
    prompt position under ``masking_strategy: rlhf`` or ``generic`` needs its prompt
    log-probs)."""
    require_teacher_log_probs(td)
    values = td.get(TEACHER_LOG_PROBS)
    _check_counts(values, td.get(log_probs_key), values_masks)
    teacher, known = align_to_layout(values, values_masks, layout, TEACHER_LOG_PROBS)
    teacher, known = teacher.to(mask.device), known.to(mask.device)
    missing = mask & ~known
    if missing.any():
        row = int(missing.any(1).nonzero()[0])
        raise ValueError(
            f"row {row}: {TEACHER_LOG_PROBS!r} has no values for some trained positions; the "
            "teacher must score every token the loss trains on (its prompt log-probs too when "
            "the masking strategy trains prompt positions)"
        )
    return teacher


def _check_counts(teacher: Any, sampling: Any, masks: Masks | None) -> None:
    """Each row's teacher and sampler response log-probs count the same tokens."""
    teacher_rows = field_rows(teacher, "response", masks)
    sampled_rows = field_rows(sampling, "response", masks)
    if teacher_rows is None or sampled_rows is None:
        return  # laid over the layout, a full-only container is checked by its length
    for row, (ours, theirs) in enumerate(zip(teacher_rows, sampled_rows, strict=True)):
        if ours.shape[0] != theirs.shape[0]:
            raise ValueError(
                f"row {row}: {TEACHER_LOG_PROBS!r} has {ours.shape[0]} response log-probs, the "
                f"sampler's log_probs {theirs.shape[0]}: the teacher must score this batch's own "
                "sampled tokens (was the batch changed after the teacher scored it?)"
            )
