"""Supervised fine-tuning losses on chat data: NLL of the assistant tokens, or MinorSFT.

:func:`sft_objective` holds the math on plain ``[N, L]`` tensors; :class:`SFTLoss` scores a
batch of conversations with the actor and calls it. Per assistant token ``t``::

    sft:        loss_t = -log_probs_t
    minor_sft:  loss_t = -log_sigmoid(beta * (log_probs_t - ref_log_probs_t))

reduced over the assistant tokens (see ``reduction`` and ``normalize_by_seq_length``), plus
``kl_to_ref_coeff * k3(ref - current)`` reduced the same way when a coefficient is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorClass, TensorDictBase
from torch import nn
from torch.nn import functional

from llmrl.objectives.token_level import (
    align_to_layout,
    k3,
    masked_mean,
    per_row_sum,
    prediction_mask,
)
from llmrl.policies.policy_inputs import get_input

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from llmrl.policies import LLMWrapperBase

LOSS_FUNCTIONS: tuple[str, ...] = ("sft", "minor_sft")
REDUCTIONS: tuple[str, ...] = ("mean", "sum", "none")


class SFTLossOutput(TensorClass["nocast"]):
    """What :class:`SFTLoss` returns: ``loss_*`` terms (with gradients) and detached values.

    ``sft`` is the NLL reduced like the loss (reported whatever ``loss_function`` is),
    ``minor_sft`` the MinorSFT value (with ``loss_function="minor_sft"`` only) and ``kl_to_ref``
    the mean k3 KL over the assistant tokens (when reference log-probs are given). Scalars, or
    ``[N]`` per-sequence values with ``reduction="none"``.

    Example:
        out = sft_loss(batch)
        out.loss.backward()  # == out.total() == loss_sft + loss_kl_to_ref
    """

    loss_sft: torch.Tensor
    loss_kl_to_ref: torch.Tensor
    sft: torch.Tensor
    minor_sft: torch.Tensor | None = None
    kl_to_ref: torch.Tensor | None = None

    def total(self) -> torch.Tensor:
        """The loss to minimise: ``loss_sft + loss_kl_to_ref``."""
        return self.loss_sft + self.loss_kl_to_ref

    @property
    def loss(self) -> torch.Tensor:
        """Alias of :meth:`total`."""
        return self.total()


def _check_options(
    loss_function: str, reduction: str, beta: float, kl_to_ref_coeff: float | None
) -> None:
    if loss_function not in LOSS_FUNCTIONS:
        raise ValueError(
            f"unknown loss_function {loss_function!r}; options: {list(LOSS_FUNCTIONS)}"
        )
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; options: {list(REDUCTIONS)}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if kl_to_ref_coeff is not None and kl_to_ref_coeff < 0:
        raise ValueError(f"kl_to_ref_coeff must be >= 0, got {kl_to_ref_coeff}")


def sft_objective(
    log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_function: str = "sft",
    ref_log_probs: torch.Tensor | None = None,
    beta: float = 0.1,
    normalize_by_seq_length: bool = False,
    kl_to_ref_coeff: float | None = None,
    reduction: str = "mean",
) -> SFTLossOutput:
    """The SFT loss of ``[N, L]`` log-probs over the assistant tokens ``mask``.

    Reductions, with ``s_i`` the sum of a per-token loss over row ``i``'s ``n_i`` tokens:

    - ``normalize_by_seq_length=False``: ``mean`` = ``sum_i s_i / sum_i n_i`` (token mean),
      ``sum`` = ``sum_i s_i``, ``none`` = ``[s_i]``;
    - ``normalize_by_seq_length=True``: ``m_i = s_i / n_i`` first; ``mean`` = mean of ``m_i``,
      ``sum`` = ``sum_i m_i``, ``none`` = ``[m_i]``.

    Every row needs at least one assistant token (a ``ValueError`` names the rows that have
    none). Positions outside ``mask`` are ignored and get exactly zero gradient.

    Example:
        out = sft_objective(log_probs, assistant_mask)
        out.loss_sft.backward()
    """
    _check_options(loss_function, reduction, beta, kl_to_ref_coeff)
    mask = mask.bool()
    empty = (mask.sum(1) == 0).nonzero().squeeze(1).tolist()
    if empty:
        raise ValueError(f"batch rows {empty} have no assistant tokens to train on")
    needs_ref = loss_function == "minor_sft" or bool(kl_to_ref_coeff)
    if needs_ref and ref_log_probs is None:
        raise ValueError("loss_function='minor_sft' and kl_to_ref_coeff need ref_log_probs")

    def valid(values: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, values, torch.zeros_like(values))

    def reduce(per_token: torch.Tensor) -> torch.Tensor:
        sums, counts = per_row_sum(per_token, mask), mask.sum(1)
        if normalize_by_seq_length:
            sums = sums / counts
            total = sums.mean() if reduction == "mean" else sums.sum()
        else:
            total = sums.sum() / counts.sum() if reduction == "mean" else sums.sum()
        return sums if reduction == "none" else total

    current = valid(log_probs)
    ref = valid(ref_log_probs.detach()) if ref_log_probs is not None else None
    nll = reduce(-current)
    minor = None
    if loss_function == "minor_sft":
        assert ref is not None
        minor = reduce(-functional.logsigmoid(beta * (current - ref)))
    kl_tokens = k3(ref - current) if ref is not None else None
    zero = reduce(torch.zeros_like(current))
    return SFTLossOutput(
        loss_sft=minor if minor is not None else nll,
        loss_kl_to_ref=(
            kl_to_ref_coeff * reduce(kl_tokens)
            if kl_to_ref_coeff and kl_tokens is not None
            else zero
        ),
        sft=nll.detach(),
        minor_sft=minor.detach() if minor is not None else None,
        kl_to_ref=masked_mean(kl_tokens, mask).detach() if kl_tokens is not None else None,
        batch_size=[],
    )


class SFTLoss(nn.Module):
    """SFT loss on a batch ``[N]`` of conversations (or token sequences) and their assistant
    masks.

    The actor is turned into a scoring twin (``generate=False, pad_output=True``, its input mode
    kept, weights shared): in ``history`` mode it scores ``("history", "full")`` chats, whose
    assistant mask covers the assistant content and end-of-turn tokens of every assistant turn;
    in ``tokens`` mode it scores ``("tokens", "full")`` with the batch's ``masks.assistant``.
    The loss trains on ``masks.assistant`` (never a row's first token, which has no prediction).

    Args:
        actor: the policy being trained.
        loss_function: ``sft`` (NLL) or ``minor_sft`` (needs ``ref_log_probs``).
        beta: MinorSFT's temperature.
        normalize_by_seq_length: average each sequence over its tokens first.
        kl_to_ref_coeff: weight of a k3 KL-to-reference term (None: none; needs
            ``ref_log_probs``, laid out like the batch's tokens, e.g. from ``RetrieveLogProb``).
        tokenizer: the tokenizer that templates chats; default the actor's.
        reduction: ``mean``, ``sum`` or ``none`` (see :func:`sft_objective`).
        ref_log_probs_key: where the reference :class:`LogProbs` are.

    Example:
        loss = SFTLoss(TransformersWrapper(model, tokenizer, input_mode="history"))
        batch = TensorDict({"history": ChatHistory(full=chats, batch_size=[2])}, [2])
        loss(batch).loss.backward()
    """

    def __init__(
        self,
        actor: LLMWrapperBase,
        loss_function: str = "sft",
        beta: float = 0.1,
        normalize_by_seq_length: bool = False,
        kl_to_ref_coeff: float | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        reduction: str = "mean",
        ref_log_probs_key: str = "ref_log_probs",
    ) -> None:
        super().__init__()
        _check_options(loss_function, reduction, beta, kl_to_ref_coeff)
        self.loss_function = loss_function
        self.beta = beta
        self.normalize_by_seq_length = normalize_by_seq_length
        self.kl_to_ref_coeff = kl_to_ref_coeff
        self.reduction = reduction
        self.ref_log_probs_key = ref_log_probs_key
        self.actor = actor.get_new_version(
            generate=False,
            pad_output=True,
            return_log_probs=True,
            return_logits=False,
            min_batch_size=None,
            max_batch_size=None,
        )
        if tokenizer is not None:
            self.actor.tokenizer = tokenizer

    def forward(self, td: TensorDictBase) -> SFTLossOutput:
        """The loss of a batch ``[N]``."""
        if td.batch_dims != 1:
            raise ValueError(
                f"SFTLoss takes a batch [N]; got {list(td.batch_size)} (use td.reshape(-1))"
            )
        keys = self.actor.keys
        if self.loss_function == "minor_sft" or self.kl_to_ref_coeff:
            get_input(td, self.ref_log_probs_key)
        key = self.actor.input_key
        root = key if isinstance(key, str) else key[0]
        scored = self.actor(td.select(root, keys["masks"], strict=False))
        log_probs = scored.get(keys["log_probs"]).full
        masks = scored.get(keys["masks"]).to(log_probs.device)
        if masks.assistant is None:
            raise ValueError(
                "SFTLoss needs assistant masks: score chat histories, or give tokens with "
                "masks.assistant (or a prompt/response split)"
            )
        mask = masks.assistant.bool() & prediction_mask(masks)
        ref = None
        if td.get(self.ref_log_probs_key, None) is not None:
            ref, known = align_to_layout(
                td.get(self.ref_log_probs_key),
                td.get(keys["masks"], None),
                masks,
                self.ref_log_probs_key,
            )
            if (mask & ~known).any():
                raise ValueError(
                    f"{self.ref_log_probs_key!r} has no values for some assistant tokens; it "
                    "needs full (or prompt and response) log-probs"
                )
        return sft_objective(
            log_probs,
            mask,
            loss_function=self.loss_function,
            ref_log_probs=ref,
            beta=self.beta,
            normalize_by_seq_length=self.normalize_by_seq_length,
            kl_to_ref_coeff=self.kl_to_ref_coeff,
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        return (
            f"loss_function={self.loss_function!r}, beta={self.beta}, "
            f"normalize_by_seq_length={self.normalize_by_seq_length}, "
            f"kl_to_ref_coeff={self.kl_to_ref_coeff}, reduction={self.reduction!r}"
        )
