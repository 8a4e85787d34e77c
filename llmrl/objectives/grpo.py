"""GRPO's loss module: :class:`GRPOLoss` reads a collector's batch, scores it with the actor and
calls :func:`~llmrl.objectives.grpo_objective.grpo_objective`, which holds the math on plain
``[N, L]`` tensors (formulas and diagnostics in :mod:`llmrl.objectives.grpo_objective`).

Variants subclass :class:`GRPOLoss` and override its one :meth:`GRPOLoss.policy_gradient`:
:class:`~llmrl.objectives.GSPOLoss`, :class:`~llmrl.objectives.CISPOLoss`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase
from torch import nn

from llmrl.data import LogProbs, unpad_sequences
from llmrl.objectives.consistency import logprob_gap_rows
from llmrl.objectives.distillation import (
    TeacherSignal,
    aligned_teacher_log_probs,
    require_teacher_log_probs,
    teacher_signal,
)
from llmrl.objectives.grpo_objective import (
    GRPOLossOutput,
    check_coeffs,
    clip_bounds,
    grpo_objective,
)
from llmrl.objectives.mismatch import MismatchCorrection
from llmrl.objectives.policy_gradient import PolicyGradientTerm, clipped_token_term
from llmrl.objectives.token_level import (
    align_to_layout,
    check_aggregation,
    kept_rows,
    prediction_mask,
    response_columns,
)
from llmrl.policies.policy_inputs import get_input

if TYPE_CHECKING:
    from llmrl.config.grpo import GRPOLossSettings
    from llmrl.config.model_signals import DistillationSettings
    from llmrl.data import Masks
    from llmrl.policies import LLMWrapperBase

MASKING_STRATEGIES: tuple[str, ...] = ("sft", "rlhf", "generic")


class GRPOLoss(nn.Module):
    """GRPO loss on a collector's batch ``[N]`` (the math: :mod:`llmrl.objectives.grpo_objective`).

    ``forward(td)`` reads ``tokens`` (ragged or padded, with ``prompt``/``response``/``full``),
    ``masks`` (with ``assistant``), the sampling ``log_probs`` (``log_probs.response``), the
    per-sequence ``advantage``, when used, ``ref_log_probs``, and when present ``loss_mask``
    (``[N]`` bool: a False row adds nothing to the loss nor its normalizer); it scores the
    tokens with a scoring twin of ``actor`` (``generate=False, input_mode="tokens",
    pad_output=True``, sharing its weights; per-token entropies are requested only when
    ``entropy_coeff > 0``, so ``entropy`` is reported only then) and returns a
    :class:`GRPOLossOutput`.

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
        distillation: on-policy distillation (``coeff``, ``task_weight``): each trained
            token's advantage becomes ``task_weight * A_i + coeff * (teacher - sampler)``
            (:mod:`llmrl.objectives.distillation`), from the batch's ``teacher_log_probs``;
            off by default.
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
        options = settings.model_dump(exclude={"variant", "mismatch", "distillation"})
        mismatch = settings.mismatch
        return cls(
            actor,
            **options,
            mismatch=MismatchCorrection(**mismatch.model_dump()) if mismatch else None,
            distillation=settings.distillation,
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
        distillation: DistillationSettings | None = None,
        advantage_key: str = "advantage",
        ref_log_probs_key: str = "ref_log_probs",
        old_log_probs_key: str | None = None,
    ) -> None:
        super().__init__()
        self.clip_epsilon = clip_bounds(clip_epsilon)
        check_aggregation(aggregation, max_length_norm)
        if masking_strategy not in MASKING_STRATEGIES:
            raise ValueError(
                f"unknown masking_strategy {masking_strategy!r}; "
                f"options: {list(MASKING_STRATEGIES)}"
            )
        check_coeffs(
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
        self.distillation = distillation
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
        if self.distillation is not None:  # before the forward, which costs
            require_teacher_log_probs(td)
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
        advantage = td.get(self.advantage_key).to(current.device)
        distilled = None
        if self.distillation is not None:
            distilled = self._teacher_signal(td, in_masks, masks, mask, sampling, advantage)
            advantage = distilled.advantage  # [N, L]
        out = grpo_objective(  # rows reward shaping masked out train nothing (audited still)
            current,
            anchor,
            advantage,
            kept_rows(td, mask),
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
        if distilled is not None:
            out.distill_reverse_kl = distilled.reverse_kl
            out.distill_teacher_logprob_mean = distilled.teacher_logprob_mean
            out.distill_teacher_share = distilled.teacher_share
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

    def _teacher_signal(
        self,
        td: TensorDictBase,
        in_masks: Masks | None,
        masks: Masks,
        mask: torch.Tensor,
        sampling: torch.Tensor,
        advantage: torch.Tensor,
    ) -> TeacherSignal:
        """Each trained token's distillation advantage (:mod:`llmrl.objectives.distillation`)
        from the batch's ``teacher_log_probs`` and the sampler's log-probs over the layout."""
        assert self.distillation is not None
        teacher = aligned_teacher_log_probs(td, in_masks, masks, mask, self.actor.keys["log_probs"])
        return teacher_signal(
            advantage,
            teacher,
            sampling,
            mask,
            coeff=self.distillation.coeff,
            task_weight=self.distillation.task_weight,
        )

    def extra_repr(self) -> str:
        return (
            f"clip_epsilon={self.clip_epsilon}, aggregation={self.aggregation!r}, "
            f"masking_strategy={self.masking_strategy!r}, kl_to_ref_coeff={self.kl_to_ref_coeff}, "
            f"kl_to_inference_coeff={self.kl_to_inference_coeff}, "
            f"entropy_coeff={self.entropy_coeff}, tis_cap={self.tis_cap}, "
            f"mismatch={self.mismatch}, distillation={self.distillation}"
        )
