"""GRPO: the clipped policy-gradient loss on group-relative advantages.

:func:`grpo_objective` holds the math on plain ``[N, L]`` tensors (testable without a model);
:class:`GRPOLoss` reads a collector's batch, scores it with the actor and calls it.

Per valid token ``t`` of sequence ``i`` (``A_i`` the sequence's advantage)::

    r      = exp(log_probs - old_log_probs)
    loss_t = w_t * pg_t,   pg_t = -min(r * A_i, clip(r, 1 - eps_low, 1 + eps_high) * A_i)
    w_t    = min(exp(old_log_probs - inference_log_probs), tis_cap)   (1 without tis_cap)

``pg_t`` is the *policy-gradient term* (:mod:`llmrl.objectives.policy_gradient`), the one part
the variants change: :class:`GRPOLoss` computes it in :meth:`GRPOLoss.policy_gradient`, which
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

from typing import TYPE_CHECKING

import torch
from tensordict import TensorClass, TensorDictBase
from torch import nn

from llmrl.data import LogProbs, unpad_sequences
from llmrl.objectives.consistency import logprob_gap_rows
from llmrl.objectives.mismatch import MismatchCorrection
from llmrl.objectives.policy_gradient import PolicyGradient, PolicyGradientTerm, clipped_token_term
from llmrl.objectives.token_level import (
    aggregate,
    aggregation_normalizer,
    align_to_layout,
    check_aggregation,
    k3,
    masked_mean,
    prediction_mask,
    response_columns,
)
from llmrl.policies.policy_inputs import get_input

if TYPE_CHECKING:
    from llmrl.config.grpo import GRPOLossSettings
    from llmrl.data import Masks
    from llmrl.policies import LLMWrapperBase

MASKING_STRATEGIES: tuple[str, ...] = ("sft", "rlhf", "generic")


class GRPOLossOutput(TensorClass["nocast"]):
    """What :class:`GRPOLoss` returns: the ``loss_*`` terms (with gradients) and detached
    diagnostics. Scalars, or ``[N, L]`` per-token terms with ``aggregation="none"``.

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
    sampler_gap: torch.Tensor | None = None
    """``[N, 4]``: how far the trainer's log-probs (the ratio's anchor when
    ``old_log_probs_key`` is set, else the current ones) are from the sampler's on each row's
    sampled, trained tokens (:func:`~llmrl.objectives.consistency.logprob_gap_rows`; set by
    :class:`GRPOLoss`): the consistency audit's input."""

    def total(self) -> torch.Tensor:
        """The loss to minimise: the sum of the ``loss_*`` terms."""
        terms = (self.loss_entropy, self.loss_kl_to_ref, self.loss_kl_to_inference)
        return sum(terms, self.loss_objective)

    @property
    def loss(self) -> torch.Tensor:
        """Alias of :meth:`total`."""
        return self.total()


def _clip_bounds(clip_epsilon: float | tuple[float, float]) -> tuple[float, float]:
    low, high = (
        (clip_epsilon, clip_epsilon) if isinstance(clip_epsilon, (int, float)) else clip_epsilon
    )
    if not 0 <= low <= 1 or high < 0:
        raise ValueError(
            f"clip_epsilon must be >= 0 (and eps_low <= 1), got eps_low={low}, eps_high={high}"
        )
    return float(low), float(high)


def _check_coeffs(**coeffs: float | None) -> None:
    for name, value in coeffs.items():
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


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
        advantage: ``[N]`` (or ``[N, 1]``), one per sequence.
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
    eps_low, eps_high = _clip_bounds(clip_epsilon)
    check_aggregation(aggregation, max_length_norm)
    _check_coeffs(
        kl_to_ref_coeff=kl_to_ref_coeff,
        kl_to_inference_coeff=kl_to_inference_coeff,
        entropy_coeff=entropy_coeff,
    )
    if tis_cap is not None and tis_cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {tis_cap}")
    if tis_cap is not None:
        if mismatch is not None:
            raise ValueError("tis_cap and mismatch both set: tis_cap is the token/truncate case")
        mismatch = MismatchCorrection("token", "truncate", tis_cap)
    if kl_to_ref_coeff > 0 and ref_log_probs is None:
        raise ValueError("kl_to_ref_coeff > 0 needs ref_log_probs")
    if entropy_coeff > 0 and entropy is None:
        raise ValueError("entropy_coeff > 0 needs the token entropy")
    mask = mask.bool()
    if advantage.dim() == 2 and advantage.shape[1] == 1:
        advantage = advantage.squeeze(1)
    if log_probs.dim() != 2 or advantage.shape != log_probs.shape[:1]:
        raise ValueError(
            f"expected log_probs [N, L] and advantage [N], got {list(log_probs.shape)} and "
            f"{list(advantage.shape)}"
        )

    def valid(values: torch.Tensor) -> torch.Tensor:  # padding must never reach the math
        return torch.where(mask, values, torch.zeros_like(values))

    current = valid(log_probs)
    old = valid(old_log_probs.detach())
    inference = old if inference_log_probs is None else valid(inference_log_probs.detach())
    adv = advantage.detach().unsqueeze(1).to(current.dtype)

    term = policy_gradient(current, old, adv, mask, (eps_low, eps_high))
    objective = term.loss
    corrected = None
    if mismatch is not None:
        corrected = mismatch.weights(old, inference, mask)
        objective = objective * corrected.weight

    def reduce(per_token: torch.Tensor) -> torch.Tensor:
        return aggregate(per_token, mask, aggregation, max_length_norm)

    zero = reduce(torch.zeros_like(current))
    kl_ref_tokens = (
        k3(valid(ref_log_probs.detach()) - current) if ref_log_probs is not None else None
    )
    ent = valid(entropy) if entropy is not None else None

    with torch.no_grad():
        log_ratio = current - old
        ratio = log_ratio.exp()
        weights = torch.where(mask, ratio, torch.zeros_like(ratio))
        count = mask.sum()
        ess = weights.sum() ** 2 / (count * (weights**2).sum()).clamp(min=torch.finfo().tiny)
        diagnostics = {
            "clip_fraction": masked_mean(term.clipped.to(current.dtype), mask),
            "kl_approx": masked_mean(k3(log_ratio), mask),
            "ESS": ess if count > 0 else ess.new_zeros(()),
            "entropy": masked_mean(ent, mask) if ent is not None else None,
            "kl_to_ref": masked_mean(kl_ref_tokens, mask) if kl_ref_tokens is not None else None,
            "mismatch_fraction": corrected.fraction if corrected is not None else None,
        }
    return GRPOLossOutput(
        loss_objective=reduce(objective),
        loss_entropy=-entropy_coeff * reduce(ent) if entropy_coeff > 0 else zero,
        loss_kl_to_ref=kl_to_ref_coeff * reduce(kl_ref_tokens) if kl_to_ref_coeff > 0 else zero,
        loss_kl_to_inference=(
            kl_to_inference_coeff * reduce(k3(inference - current))
            if kl_to_inference_coeff > 0
            else zero
        ),
        **diagnostics,
        normalizer=aggregation_normalizer(mask, aggregation),
        batch_size=[],
    )


class GRPOLoss(nn.Module):
    """GRPO loss on a collector's batch ``[N]`` (see the module docstring for the math).

    ``forward(td)`` reads ``tokens`` (ragged or padded, with ``prompt``/``response``/``full``),
    ``masks`` (with ``assistant``), the sampling ``log_probs`` (``log_probs.response``), the
    per-sequence ``advantage`` and, when used, ``ref_log_probs``; it scores the tokens with a
    scoring twin of ``actor`` (``generate=False, input_mode="tokens", pad_output=True``, sharing
    its weights; per-token entropies are requested only when ``entropy_coeff > 0``, so
    ``entropy`` is reported only then) and returns a :class:`GRPOLossOutput`.

    Masking strategies, over the padded ``full = cat(prompt, response)`` layout (each row's first
    token, which has no prediction, is never included):

    - ``sft``: the response tokens;
    - ``rlhf``: every assistant token (``masks.assistant``), earlier assistant turns of a
      multi-turn prompt included;
    - ``generic``: every real token.

    Prompt positions (under ``rlhf``, the earlier assistant turns of a multi-turn row) have no
    sampling log-probs when the batch comes from a sampling policy (it writes response log-probs
    only; ``log_probs.prompt`` or ``log_probs.full`` are used when present). They are trained
    all the same: their ratio's anchor is the ``old_log_probs_key`` log-probs when set (a
    position it does not cover is left out), else the current log-probs, detached, a ratio of 1:
    the first update on a batch (the sampler's weights) gets the exact policy gradient
    ``A * grad log p`` there, and later updates on the same batch are not clipped there. The
    anchor also stands in for the sampler's log-probs there (TIS weight 1, no KL to inference).

    The ratio's anchor is the sampling ``log_probs``, or the :class:`LogProbs` at
    ``old_log_probs_key`` when set (the training model's log-probs of the sampling policy,
    computed once per batch before its first update: :meth:`anchor_log_probs`).
    Truncated importance sampling (``tis_cap``) needs the two apart: each token's objective is
    weighted by ``min(exp(anchor - sampling), tis_cap)``. Without ``old_log_probs_key`` the
    anchor is then the current log-probs, detached: right only when the batch gets a single
    optimizer step (its weights are still those before the update; the ratio is 1, so ``ESS``
    is 1 and ``clip_fraction`` 0). With several (``updates_per_step > 1``, minibatches) the
    anchor must stay the pre-update log-probs, or the ratio is 1 at every update and nothing is
    ever clipped: :class:`~llmrl.train.grpo_trainer.GRPOTrainer` then writes
    :meth:`anchor_log_probs` into each minibatch before the first update and sets
    ``old_log_probs_key``.

    Variants subclass it and override the one method :meth:`policy_gradient` (the per-token
    policy-gradient term): :class:`~llmrl.objectives.GSPOLoss`,
    :class:`~llmrl.objectives.CISPOLoss`.

    Args:
        actor: the policy being trained (a sampling policy is fine: a scoring twin is made).
        clip_epsilon: ``eps`` or ``(eps_low, eps_high)``.
        kl_to_ref_coeff, kl_to_inference_coeff, entropy_coeff: weights of the extra terms.
        aggregation: ``token_mean``, ``prompt_mean``, ``sum_norm`` (Dr. GRPO, needs
            ``max_length_norm``) or ``none`` (per-token ``[N, L]``).
        masking_strategy: ``sft``, ``rlhf`` or ``generic``.
        tis_cap: truncated importance sampling cap; off by default.
        mismatch: a train/inference mismatch correction (token or sequence level, truncate or
            mask; :mod:`llmrl.objectives.mismatch`); off by default. Not with ``tis_cap``.
        advantage_key, ref_log_probs_key, old_log_probs_key: where to read those entries.

    Example:
        loss = GRPOLoss(policy, clip_epsilon=(0.2, 0.28), kl_to_ref_coeff=0.01)
        out = loss(batch)  # batch: collector output with "advantage" set by MCAdvantage
        out.loss.backward()
    """

    @classmethod
    def from_settings(
        cls, actor: LLMWrapperBase, settings: GRPOLossSettings, max_new_tokens: int
    ) -> GRPOLoss:
        """The loss a stage config's ``loss`` section describes.

        Every field of :class:`~llmrl.config.grpo.GRPOLossSettings` but ``variant`` (which picks
        the class) is the keyword of the same name here, so a new option is a field there and
        a keyword here; nothing in between maps them. ``mismatch`` becomes a
        :class:`MismatchCorrection`, and ``aggregation: sum_norm`` divides by the generation
        budget ``max_new_tokens``.
        """
        options = settings.model_dump(exclude={"variant", "mismatch"})
        mismatch = settings.mismatch
        return cls(
            actor,
            **options,
            mismatch=MismatchCorrection(**mismatch.model_dump()) if mismatch else None,
            max_length_norm=max_new_tokens if settings.aggregation == "sum_norm" else None,
        )

    def __init__(
        self,
        actor: LLMWrapperBase,
        clip_epsilon: float | tuple[float, float] = 0.2,
        kl_to_ref_coeff: float = 0.0,
        kl_to_inference_coeff: float = 0.0,
        entropy_coeff: float = 0.0,
        aggregation: str = "token_mean",
        max_length_norm: float | None = None,
        masking_strategy: str = "sft",
        tis_cap: float | None = None,
        mismatch: MismatchCorrection | None = None,
        advantage_key: str = "advantage",
        ref_log_probs_key: str = "ref_log_probs",
        old_log_probs_key: str | None = None,
    ) -> None:
        super().__init__()
        self.clip_epsilon = _clip_bounds(clip_epsilon)
        check_aggregation(aggregation, max_length_norm)
        if masking_strategy not in MASKING_STRATEGIES:
            raise ValueError(
                f"unknown masking_strategy {masking_strategy!r}; "
                f"options: {list(MASKING_STRATEGIES)}"
            )
        _check_coeffs(
            kl_to_ref_coeff=kl_to_ref_coeff,
            kl_to_inference_coeff=kl_to_inference_coeff,
            entropy_coeff=entropy_coeff,
            tis_cap=tis_cap,
        )
        self.kl_to_ref_coeff = kl_to_ref_coeff
        self.kl_to_inference_coeff = kl_to_inference_coeff
        self.entropy_coeff = entropy_coeff
        self.aggregation = aggregation
        self.max_length_norm = max_length_norm
        self.masking_strategy = masking_strategy
        if tis_cap is not None and mismatch is not None:
            raise ValueError("tis_cap and mismatch both set: tis_cap is the token/truncate case")
        self.tis_cap = tis_cap
        self.mismatch = mismatch
        self.advantage_key = advantage_key
        self.ref_log_probs_key = ref_log_probs_key
        self.old_log_probs_key = old_log_probs_key
        self.actor = actor.get_new_version(
            generate=False,
            input_mode="tokens",
            pad_output=True,
            return_log_probs=True,
            return_logits=False,
            return_entropy=entropy_coeff > 0,
            # the "sft" mask trains on response tokens only: skip the output layer over prompts
            score_responses_only=masking_strategy == "sft",
            min_batch_size=None,
            max_batch_size=None,
        )

    def forward(self, td: TensorDictBase) -> GRPOLossOutput:
        """The loss of a batch ``[N]`` (see the class docstring for the entries it reads)."""
        if td.batch_dims != 1:
            raise ValueError(
                f"GRPOLoss takes a batch [N]; got {list(td.batch_size)} (use td.reshape(-1))"
            )
        keys = self.actor.keys
        for key in (keys["tokens"], keys["log_probs"], self.advantage_key):
            get_input(td, key)
        if self.kl_to_ref_coeff > 0:
            get_input(td, self.ref_log_probs_key)
        if self.old_log_probs_key is not None:
            get_input(td, self.old_log_probs_key)

        scored = self.actor(td.select(keys["tokens"], keys["masks"], strict=False))
        current = scored.get(keys["log_probs"]).full
        masks: Masks = scored.get(keys["masks"]).to(current.device)
        if torch.is_grad_enabled() and not current.requires_grad:
            raise RuntimeError(
                "the actor's scoring gives no gradients; GRPOLoss needs a trainable backend "
                "(e.g. TransformersWrapper)"
            )
        in_masks = td.get(keys["masks"], None)
        sampling, known = align_to_layout(td.get(keys["log_probs"]), in_masks, masks, "log_probs")
        mask = self._mask(masks)
        anchor = sampling
        if self.old_log_probs_key is not None:
            anchor, anchor_known = align_to_layout(
                td.get(self.old_log_probs_key), in_masks, masks, self.old_log_probs_key
            )
            mask = mask & anchor_known
        elif self.tis_cap is not None or self.mismatch is not None:
            anchor = current.detach()
        # trained positions the sampler has no log-probs for (earlier assistant turns of a
        # multi-turn prompt): the anchor there is the current log-probs unless given, and it
        # stands in for the sampler's (see the class docstring)
        unsampled = mask & ~known
        if self.old_log_probs_key is None:
            anchor = torch.where(unsampled, current.detach(), anchor)
        sampling = torch.where(unsampled, anchor, sampling)
        ref = self._ref_log_probs(td, in_masks, masks, mask)
        entropy = None
        if self.entropy_coeff > 0:  # laid out like the log-probs (the actor pads its output)
            entropy = scored.get("entropy").full.to(current.device)
        out = grpo_objective(
            current,
            anchor,
            td.get(self.advantage_key).to(current.device),
            mask,
            clip_epsilon=self.clip_epsilon,
            aggregation=self.aggregation,
            max_length_norm=self.max_length_norm,
            inference_log_probs=sampling,
            ref_log_probs=ref,
            entropy=entropy,
            kl_to_ref_coeff=self.kl_to_ref_coeff,
            kl_to_inference_coeff=self.kl_to_inference_coeff,
            entropy_coeff=self.entropy_coeff,
            tis_cap=self.tis_cap,
            policy_gradient=self.policy_gradient,
            mismatch=self.mismatch,
        )
        # the audit's input: the sampler against the trainer before any update (the anchor when
        # given, else these log-probs), where the sampler gave its own
        trainer = anchor if self.old_log_probs_key is not None else current
        out.sampler_gap = logprob_gap_rows(trainer, sampling, mask & known)
        return out

    def policy_gradient(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantage: torch.Tensor,
        mask: torch.Tensor,
        clip: tuple[float, float],
    ) -> PolicyGradientTerm:
        """Each token's policy-gradient loss, the one method a variant overrides (signature:
        :data:`~llmrl.objectives.policy_gradient.PolicyGradient`). GRPO: PPO's clipped
        surrogate (:func:`~llmrl.objectives.policy_gradient.clipped_token_term`)."""
        return clipped_token_term(log_probs, old_log_probs, advantage, mask, clip)

    @torch.no_grad()
    def anchor_log_probs(self, td: TensorDictBase) -> LogProbs:
        """The actor's log-probs of ``td``'s tokens now, without gradients, as a ragged
        :class:`LogProbs` (``full``, in the tokens' order): what ``old_log_probs_key`` reads.

        Call it once per batch before the first update so the anchor stays the pre-update
        policy's (see the class docstring)."""
        keys = self.actor.keys
        scored = self.actor(td.select(keys["tokens"], keys["masks"], strict=False))
        full = scored.get(keys["log_probs"]).full.detach()
        masks: Masks = scored.get(keys["masks"]).to(full.device)
        return LogProbs.from_sequences(full=unpad_sequences(full, masks.full))

    def _mask(self, masks: Masks) -> torch.Tensor:
        valid = prediction_mask(masks)
        if self.masking_strategy == "sft":
            return valid & response_columns(masks)
        if self.masking_strategy == "rlhf":
            if masks.assistant is None:
                raise ValueError("masking_strategy='rlhf' needs masks.assistant in the batch")
            return valid & masks.assistant.bool()
        return valid

    def _ref_log_probs(
        self, td: TensorDictBase, in_masks: Masks | None, masks: Masks, mask: torch.Tensor
    ) -> torch.Tensor | None:
        """Reference log-probs over the layout; None when absent (or, with no KL term, when
        they do not cover the trained positions)."""
        if td.get(self.ref_log_probs_key, None) is None:
            return None
        ref, known = align_to_layout(
            td.get(self.ref_log_probs_key), in_masks, masks, self.ref_log_probs_key
        )
        if (mask & ~known).any():
            if self.kl_to_ref_coeff > 0:
                raise ValueError(
                    f"{self.ref_log_probs_key!r} has no values for some trained positions (prompt "
                    f"tokens under masking_strategy={self.masking_strategy!r}); it needs its "
                    "prompt or full log-probs"
                )
            return None
        return ref

    def extra_repr(self) -> str:
        return (
            f"clip_epsilon={self.clip_epsilon}, aggregation={self.aggregation!r}, "
            f"masking_strategy={self.masking_strategy!r}, kl_to_ref_coeff={self.kl_to_ref_coeff}, "
            f"kl_to_inference_coeff={self.kl_to_inference_coeff}, "
            f"entropy_coeff={self.entropy_coeff}, tis_cap={self.tis_cap}, "
            f"mismatch={self.mismatch}"
        )
