"""GRPO's math: the clipped policy-gradient loss on group-relative advantages.

:func:`grpo_objective` holds the math on plain ``[N, L]`` tensors (testable without a model)
and returns a :class:`GRPOLossOutput`; :class:`~llmrl.objectives.grpo.GRPOLoss` reads a
collector's batch, scores it with the actor and calls it.

Per valid token ``t`` of sequence ``i`` (``A_i`` the sequence's advantage)::

    r      = exp(log_probs - old_log_probs)
    loss_t = w_t * pg_t,   pg_t = -min(r * A_i, clip(r, 1 - eps_low, 1 + eps_high) * A_i)
    w_t    = min(exp(old_log_probs - inference_log_probs), tis_cap)   (1 without tis_cap)

``pg_t`` is the *policy-gradient term* (:mod:`llmrl.objectives.policy_gradient`), the one part
the variants change: :class:`~llmrl.objectives.grpo.GRPOLoss` computes it in
:meth:`~llmrl.objectives.grpo.GRPOLoss.policy_gradient`, which
:class:`~llmrl.objectives.GSPOLoss` (sequence-level ratio) and
:class:`~llmrl.objectives.CISPOLoss` (clipped, detached importance weight) override.

plus ``kl_to_ref_coeff * k3(ref - current)``, ``kl_to_inference_coeff * k3(inference - current)``
and ``-entropy_coeff * entropy``, each aggregated with the same mask and mode. Diagnostics are
detached means over the valid tokens only (0 when there are none):

- ``clip_fraction``: tokens whose clipped branch is the one taken and has no gradient:
  ``A > 0 and r > 1 + eps_high``, or ``A < 0 and r < 1 - eps_low`` (``A == 0`` never counts);
  for a variant, the tokens its term marks ``clipped`` (see its docstring);
- ``kl_approx``: k3 estimate of ``KL(old || current)`` on the sampled tokens,
  ``mean((r - 1) - log r)`` (CleanRL's ``approx_kl``; exactly 0 when nothing changed);
- ``ESS``: normalised effective sample size of the token ratios, ``(sum r)^2 / (n * sum r^2)``;
- ``entropy``: mean token entropy (only when ``entropy`` is given);
- ``kl_to_ref``: mean ``k3(ref - current)`` (only when ``ref_log_probs`` are given).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from tensordict import TensorClass

from llmrl.objectives.mismatch import MismatchCorrection, MismatchWeights
from llmrl.objectives.policy_gradient import PolicyGradient, clipped_token_term
from llmrl.objectives.token_level import (
    aggregate,
    aggregation_normalizer,
    check_aggregation,
    k3,
    masked_mean,
)


class GRPOLossOutput(TensorClass["nocast"]):
    """What :func:`grpo_objective` and :class:`~llmrl.objectives.grpo.GRPOLoss` return: the
    ``loss_*`` terms (with gradients) and detached diagnostics. Scalars, or ``[N, L]`` per-token
    terms with ``aggregation="none"``.

    Example:
        out = loss(batch)
        out.loss.backward()  # == out.total(): the sum of the loss_* terms
        float(out.clip_fraction), float(out.kl_approx)
    """

    loss_objective: torch.Tensor
    loss_entropy: torch.Tensor
    loss_kl_to_ref: torch.Tensor
    loss_kl_to_inference: torch.Tensor
    clip_fraction: torch.Tensor
    kl_approx: torch.Tensor
    ESS: torch.Tensor
    entropy: torch.Tensor | None = None
    kl_to_ref: torch.Tensor | None = None
    mismatch_fraction: torch.Tensor | None = None
    """Share of tokens (or sequences) the mismatch correction truncated or dropped."""
    normalizer: torch.Tensor | None = None
    """What the aggregation divided by (valid tokens, or sequences): trainer ranks weight their
    means by it to get the whole batch's (see :mod:`llmrl.train.grpo_trainer`)."""
    distill_reverse_kl: torch.Tensor | None = None
    """With on-policy distillation: the mean over the trained tokens of ``log p_sampler -
    log p_teacher`` (:func:`~llmrl.objectives.distillation.reverse_kl`)."""
    distill_teacher_logprob_mean: torch.Tensor | None = None
    """With on-policy distillation: the mean over the trained tokens of ``log p_teacher``."""
    distill_teacher_share: torch.Tensor | None = None
    """With on-policy distillation: the teacher's share of the advantage's size
    (:class:`~llmrl.objectives.distillation.TeacherSignal`; 1 with ``task_weight`` 0)."""
    sampler_gap: torch.Tensor | None = None
    """``[N, 4]``: how far the trainer's log-probs (the ratio's anchor when
    ``old_log_probs_key`` is set, else the current ones) are from the sampler's on each row's
    sampled, trained tokens (:func:`~llmrl.objectives.consistency.logprob_gap_rows`; set by
    :class:`~llmrl.objectives.grpo.GRPOLoss`): the consistency audit's input."""

    def total(self) -> torch.Tensor:
        """The loss to minimise: the sum of the ``loss_*`` terms."""
        terms = (self.loss_entropy, self.loss_kl_to_ref, self.loss_kl_to_inference)
        return sum(terms, self.loss_objective)

    @property
    def loss(self) -> torch.Tensor:
        """Alias of :meth:`total`."""
        return self.total()


def clip_bounds(clip_epsilon: float | tuple[float, float]) -> tuple[float, float]:
    """``(eps_low, eps_high)`` of ``eps`` or ``(eps_low, eps_high)``, checked."""
    low, high = (
        (clip_epsilon, clip_epsilon) if isinstance(clip_epsilon, (int, float)) else clip_epsilon
    )
    if not 0 <= low <= 1 or high < 0:
        raise ValueError(
            f"clip_epsilon must be >= 0 (and eps_low <= 1), got eps_low={low}, eps_high={high}"
        )
    return float(low), float(high)


def check_coeffs(**coeffs: float | None) -> None:
    """Refuse a negative coefficient (named by its keyword); None is fine."""
    for name, value in coeffs.items():
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def _valid(mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask`` is set, 0 elsewhere: padding must never reach the math."""
    return torch.where(mask, values, torch.zeros_like(values))


@dataclass(frozen=True)
class _TokenTensors:
    """One call's ``[N, L]`` inputs, zero outside ``mask`` (padding must never reach the math);
    the anchor and the sampler's log-probs detached."""

    mask: torch.Tensor
    current: torch.Tensor
    """The log-probs being trained, with gradients."""
    old: torch.Tensor
    """The ratio's anchor."""
    inference: torch.Tensor
    """The sampler's log-probs (the anchor when not given)."""
    kl_to_ref: torch.Tensor | None
    """``k3(ref - current)`` per token, when ``ref_log_probs`` are given (after
    :meth:`with_extra_terms`)."""
    entropy: torch.Tensor | None

    def with_extra_terms(
        self, ref_log_probs: torch.Tensor | None, entropy: torch.Tensor | None
    ) -> _TokenTensors:
        """These tensors with the KL-to-ref and entropy tokens. Built after the policy-gradient
        term: autograd sums the gradients reaching ``current`` in the order of the ops that
        use it, and this order keeps them bitwise what they were."""
        kl_to_ref = None
        if ref_log_probs is not None:
            kl_to_ref = k3(_valid(self.mask, ref_log_probs.detach()) - self.current)
        return replace(
            self,
            kl_to_ref=kl_to_ref,
            entropy=_valid(self.mask, entropy) if entropy is not None else None,
        )


def _token_tensors(
    mask: torch.Tensor,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    inference_log_probs: torch.Tensor | None,
) -> _TokenTensors:
    """The masked current, anchor and sampler log-probs (the anchor stands in for the last)."""
    current = _valid(mask, log_probs)
    old = _valid(mask, old_log_probs.detach())
    inference = old if inference_log_probs is None else _valid(mask, inference_log_probs.detach())
    return _TokenTensors(
        mask=mask, current=current, old=old, inference=inference, kl_to_ref=None, entropy=None
    )


@dataclass(frozen=True)
class _Coefficients:
    """The weights of the extra loss terms, each >= 0."""

    kl_to_ref: float
    kl_to_inference: float
    entropy: float

    def __post_init__(self) -> None:
        check_coeffs(
            kl_to_ref_coeff=self.kl_to_ref,
            kl_to_inference_coeff=self.kl_to_inference,
            entropy_coeff=self.entropy,
        )

    def check_inputs(
        self, ref_log_probs: torch.Tensor | None, entropy: torch.Tensor | None
    ) -> None:
        """Refuse a term whose input is missing."""
        if self.kl_to_ref > 0 and ref_log_probs is None:
            raise ValueError("kl_to_ref_coeff > 0 needs ref_log_probs")
        if self.entropy > 0 and entropy is None:
            raise ValueError("entropy_coeff > 0 needs the token entropy")


def _resolved_mismatch(
    tis_cap: float | None, mismatch: MismatchCorrection | None
) -> MismatchCorrection | None:
    """The mismatch correction: ``mismatch``, or ``tis_cap``'s token/truncate one (not both)."""
    if tis_cap is not None and tis_cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {tis_cap}")
    if tis_cap is not None:
        if mismatch is not None:
            raise ValueError("tis_cap and mismatch both set: tis_cap is the token/truncate case")
        mismatch = MismatchCorrection("token", "truncate", tis_cap)
    return mismatch


def _advantage_column(advantage: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """The advantage ``[N]`` (or ``[N, 1]``), checked against ``log_probs [N, L]``, as a detached
    ``[N, 1]`` column of the log-probs' dtype; a per-token ``[N, L]`` advantage (on-policy
    distillation, :mod:`llmrl.objectives.distillation`) is kept as it is, detached."""
    if log_probs.dim() == 2 and advantage.shape == log_probs.shape and log_probs.shape[1] != 1:
        return advantage.detach().to(log_probs.dtype)
    if advantage.dim() == 2 and advantage.shape[1] == 1:
        advantage = advantage.squeeze(1)
    if log_probs.dim() != 2 or advantage.shape != log_probs.shape[:1]:
        raise ValueError(
            f"expected log_probs [N, L] and advantage [N] (or per token [N, L]), got "
            f"{list(log_probs.shape)} and {list(advantage.shape)}"
        )
    return advantage.detach().unsqueeze(1).to(log_probs.dtype)


def _mismatch_corrected(
    objective: torch.Tensor, mismatch: MismatchCorrection | None, tokens: _TokenTensors
) -> tuple[torch.Tensor, MismatchWeights | None]:
    """Each token's objective times its detached mismatch weight, and the weights (None and the
    objective unchanged without a correction)."""
    if mismatch is None:
        return objective, None
    corrected = mismatch.weights(tokens.old, tokens.inference, tokens.mask)
    return objective * corrected.weight, corrected


def _loss_terms(
    tokens: _TokenTensors,
    objective: torch.Tensor,
    aggregation: str,
    max_length_norm: float | None,
    coeffs: _Coefficients,
) -> dict[str, torch.Tensor]:
    """The ``loss_*`` terms: each per-token term aggregated with the mask, a coefficient of 0
    giving the aggregated zero."""

    def reduce(per_token: torch.Tensor) -> torch.Tensor:
        return aggregate(per_token, tokens.mask, aggregation, max_length_norm)

    zero = reduce(torch.zeros_like(tokens.current))
    return {
        "loss_objective": reduce(objective),
        "loss_entropy": (-coeffs.entropy * reduce(tokens.entropy) if coeffs.entropy > 0 else zero),
        "loss_kl_to_ref": (
            coeffs.kl_to_ref * reduce(tokens.kl_to_ref) if coeffs.kl_to_ref > 0 else zero
        ),
        "loss_kl_to_inference": (
            coeffs.kl_to_inference * reduce(k3(tokens.inference - tokens.current))
            if coeffs.kl_to_inference > 0
            else zero
        ),
    }


@torch.no_grad()
def _diagnostics(
    tokens: _TokenTensors, clipped: torch.Tensor, corrected: MismatchWeights | None
) -> dict[str, torch.Tensor | None]:
    """The detached diagnostics, means over the valid tokens (see the module docstring)."""
    mask, current = tokens.mask, tokens.current
    log_ratio = current - tokens.old
    ratio = log_ratio.exp()
    weights = torch.where(mask, ratio, torch.zeros_like(ratio))
    count = mask.sum()
    ess = weights.sum() ** 2 / (count * (weights**2).sum()).clamp(min=torch.finfo().tiny)
    kl_to_ref = tokens.kl_to_ref
    return {
        "clip_fraction": masked_mean(clipped.to(current.dtype), mask),
        "kl_approx": masked_mean(k3(log_ratio), mask),
        "ESS": ess if count > 0 else ess.new_zeros(()),
        "entropy": masked_mean(tokens.entropy, mask) if tokens.entropy is not None else None,
        "kl_to_ref": masked_mean(kl_to_ref, mask) if kl_to_ref is not None else None,
        "mismatch_fraction": corrected.fraction if corrected is not None else None,
    }


def grpo_objective(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_epsilon: float | tuple[float, float] = 0.2,
    aggregation: str = "token_mean",
    max_length_norm: float | None = None,
    inference_log_probs: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    kl_to_ref_coeff: float = 0.0,
    kl_to_inference_coeff: float = 0.0,
    entropy_coeff: float = 0.0,
    tis_cap: float | None = None,
    policy_gradient: PolicyGradient = clipped_token_term,
    mismatch: MismatchCorrection | None = None,
) -> GRPOLossOutput:
    """The GRPO loss of ``[N, L]`` token tensors (see the module docstring for the formulas).

    Args:
        log_probs: current log-probs, with gradients.
        old_log_probs: the ratio's anchor: log-probs of the policy that sampled.
        advantage: ``[N]`` (or ``[N, 1]``), one per sequence; or ``[N, L]``, one per token.
        mask: ``[N, L]`` bool, the tokens the loss trains on. Values elsewhere are ignored (they
            may hold anything) and get exactly zero gradient.
        inference_log_probs: the sampler's own log-probs, for ``kl_to_inference`` and truncated
            importance sampling; default ``old_log_probs``.
        ref_log_probs, entropy: needed for the KL-to-ref and entropy terms.
        tis_cap: truncated importance sampling: multiply each token's objective by the detached
            ``min(exp(old - inference), tis_cap)``; the same as
            ``mismatch=MismatchCorrection("token", "truncate", tis_cap)``. Off by default.
        mismatch: a train/inference mismatch correction (:mod:`llmrl.objectives.mismatch`):
            token or sequence importance weights, truncated or masked; its
            ``mismatch_fraction`` is reported. Not with ``tis_cap``.
        policy_gradient: the per-token policy-gradient term, called with the ``clip_epsilon``
            bounds (:mod:`llmrl.objectives.policy_gradient`); GRPO's clipped surrogate by
            default, ``gspo_term`` or ``cispo_term`` for the variants.

    Example:
        out = grpo_objective(lp, old_lp, torch.tensor([1.0, -1.0]), mask)
        out.loss_objective.backward()
    """
    clip = clip_bounds(clip_epsilon)
    check_aggregation(aggregation, max_length_norm)
    coeffs = _Coefficients(kl_to_ref_coeff, kl_to_inference_coeff, entropy_coeff)
    mismatch = _resolved_mismatch(tis_cap, mismatch)
    coeffs.check_inputs(ref_log_probs, entropy)
    mask = mask.bool()
    adv = _advantage_column(advantage, log_probs)
    tokens = _token_tensors(mask, log_probs, old_log_probs, inference_log_probs)
    term = policy_gradient(tokens.current, tokens.old, adv, mask, clip)
    objective, corrected = _mismatch_corrected(term.loss, mismatch, tokens)
    tokens = tokens.with_extra_terms(ref_log_probs, entropy)
    return GRPOLossOutput(
        **_loss_terms(tokens, objective, aggregation, max_length_norm, coeffs),
        **_diagnostics(tokens, term.clipped, corrected),
        normalizer=aggregation_normalizer(mask, aggregation),
        batch_size=[],
    )
