"""Token-level building blocks shared by the losses: laying per-row values over the padded
``full`` layout, the masks a loss trains on, masked reductions (the loss aggregation modes) and
the k3 KL estimator.

The layout is the one a scoring policy with ``pad_output=True`` returns: ``full`` is
``cat(left-padded prompt, right-padded response)`` when the prompt/response split is known, else
right-padded full sequences. ``masks.full`` marks the real positions in either case, in sequence
order, so a row's values are placed by filling the True positions of ``masks.full[row]``.

Example:
    >>> mask = torch.tensor([[False, True, True], [True, True, True]])
    >>> scatter_rows([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0, 5.0])], mask).tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from llmrl.data import Masks, unpad_sequences

AGGREGATIONS: tuple[str, ...] = ("token_mean", "prompt_mean", "sum_norm", "none")

LOSS_MASK_KEY = "loss_mask"
"""An optional bool ``[N]`` column: rows where it is False are left out of the loss (reward
shaping's ``mask`` options, :mod:`llmrl.objectives.reward_shaping`)."""


def scatter_rows(rows: Sequence[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """``rows[i]`` placed, in order, at the True positions of ``mask[i]``; zeros elsewhere.

    Differentiable with respect to the rows (padding positions get exactly zero gradient).
    """
    lengths = mask.sum(1).tolist()
    for row, (values, length) in enumerate(zip(rows, lengths, strict=True)):
        if values.shape[0] != length:
            raise ValueError(f"row {row}: {values.shape[0]} values for {length} positions")
    values = torch.cat(list(rows)).to(mask.device)
    return values.new_zeros(mask.shape).masked_scatter(mask, values)


def field_rows(container: Any, field: str, masks: Masks | None) -> list[torch.Tensor] | None:
    """The rows of ``container.<field>`` (a :class:`LogProbs` or :class:`Tokens`), or None when
    the field is not set. Padded containers are read with ``masks.<field>``."""
    if not container.has(field):
        return None
    if not container.is_padded:
        return container.as_list(field)
    mask = getattr(masks, field, None) if masks is not None else None
    if mask is None:
        raise ValueError(f"a padded container's {field!r} needs masks.{field} to be read")
    return unpad_sequences(getattr(container, field), mask)


def align_to_layout(
    values: Any, values_masks: Masks | None, layout: Masks, name: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``values`` (e.g. old or reference :class:`LogProbs`) laid over ``layout``.

    ``layout`` are the padded masks of the scored batch. When it splits prompt and response,
    each part is read from ``values.prompt``/``values.response`` if set, else cut from
    ``values.full`` (split fields are preferred: ``full`` may hold zeros outside the assistant
    mask, see ``RetrieveLogProb``). Returns the ``[N, L]`` tensor and a boolean mask of the
    positions that got a value: prompt positions are unavailable when ``values`` holds response
    log-probs only (as a sampling policy writes them).
    """
    prompt = field_rows(values, "prompt", values_masks)
    response = field_rows(values, "response", values_masks)
    full = field_rows(values, "full", values_masks)
    full_lengths = layout.full.sum(1).tolist()
    split = layout.prompt is not None and layout.response is not None
    prompt_lengths = layout.prompt.sum(1).tolist() if split else [0] * len(full_lengths)
    rows, available = [], []
    for row, (cut, length) in enumerate(zip(prompt_lengths, full_lengths, strict=True)):
        if split:
            head = _part(prompt, full, row, slice(0, cut))
            tail = _part(response, full, row, slice(cut, None))
        else:
            head = None
            tail = full[row] if full is not None else _joined(prompt, response, row)
        if tail is None:
            raise ValueError(f"{name} holds neither response nor full log-probs")
        known_head = head is not None
        head = head if known_head else tail.new_zeros(cut)
        if head.shape[0] + tail.shape[0] != length:
            raise ValueError(
                f"{name} row {row}: {head.shape[0] + tail.shape[0]} values for a sequence of "
                f"{length} tokens (do they belong to these tokens?)"
            )
        rows.append(torch.cat([head, tail]))
        available.append(
            torch.cat(
                [
                    torch.full((head.shape[0],), known_head, dtype=torch.bool),
                    torch.ones(tail.shape[0], dtype=torch.bool),
                ]
            )
        )
    return scatter_rows(rows, layout.full), scatter_rows(available, layout.full)


def _part(
    part: list[torch.Tensor] | None, full: list[torch.Tensor] | None, row: int, cut: slice
) -> torch.Tensor | None:
    if part is not None:
        return part[row]
    return full[row][cut] if full is not None else None


def _joined(
    prompt: list[torch.Tensor] | None, response: list[torch.Tensor] | None, row: int
) -> torch.Tensor | None:
    if prompt is None or response is None:
        return None
    return torch.cat([prompt[row], response[row]])


def prediction_mask(masks: Masks) -> torch.Tensor:
    """Real positions of ``full`` that have a prediction: every token but each row's first
    (nothing precedes it, so it has no log-prob)."""
    full = masks.full.bool()
    first = full & (full.long().cumsum(1) == 1)
    return full & ~first


def kept_rows(td: Any, mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (``[N, L]``) without the rows whose :data:`LOSS_MASK_KEY` is False (``mask``
    itself when ``td`` has no such column): they add nothing to the loss nor its normalizer."""
    rows = td.get(LOSS_MASK_KEY, None)
    if rows is None:
        return mask
    return mask & rows.reshape(-1, 1).to(device=mask.device, dtype=torch.bool)


def response_columns(masks: Masks) -> torch.Tensor:
    """``masks.response`` over the ``full`` layout (prompt columns False)."""
    if masks.prompt is None or masks.response is None:
        raise ValueError("the scored batch has no prompt/response split (tokens.prompt missing)")
    return torch.cat([torch.zeros_like(masks.prompt, dtype=torch.bool), masks.response], dim=1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``[N, L]`` entropy of the distribution each token was drawn from, from right-padded
    ``[N, L, vocab]`` logits (position ``t`` uses the logits at ``t - 1``; position 0 holds 0)."""
    log_p = logits[:, :-1].float().log_softmax(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return torch.cat([entropy.new_zeros(logits.shape[0], 1), entropy], dim=1)


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """The k3 KL estimator ``exp(d) - 1 - d`` of ``KL(q || p)`` for ``d = log p - log q`` on a
    sample from ``q``: unbiased, never negative, low variance (Schulman, "Approximating KL")."""
    return torch.expm1(log_ratio) - log_ratio


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the True positions of ``mask``; 0 when none is True."""
    total = torch.where(mask, values, torch.zeros_like(values)).sum()
    return total / mask.sum().clamp(min=1)


def per_row_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N]`` sums of ``values`` over the True positions of each row of ``mask``."""
    return torch.where(mask, values, torch.zeros_like(values)).sum(1)


def check_aggregation(aggregation: str, max_length_norm: float | None) -> None:
    """Reject unknown modes, ``sum_norm`` without ``max_length_norm``, and a
    ``max_length_norm`` that another mode would silently ignore."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; options: {list(AGGREGATIONS)}")
    if aggregation == "sum_norm":
        if max_length_norm is None or max_length_norm <= 0:
            raise ValueError(
                "aggregation='sum_norm' needs max_length_norm > 0 (a constant such as the "
                f"generation's max_new_tokens), got {max_length_norm}"
            )
    elif max_length_norm is not None:
        raise ValueError(
            f"max_length_norm is only used by aggregation='sum_norm', not {aggregation!r}"
        )


def aggregation_normalizer(mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """What :func:`aggregate` divides by: the valid tokens (``token_mean``, ``none``), the
    sequences with a valid token (``prompt_mean``) or all ``N`` sequences (``sum_norm``).

    Trainer ranks sum it over their shards to weight each rank's mean into the global one.
    """
    if aggregation == "prompt_mean":
        return (mask.sum(1) > 0).sum().float()
    if aggregation == "sum_norm":
        return torch.tensor(float(mask.shape[0]), device=mask.device)
    return mask.sum().float()


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, aggregation: str, max_length_norm: float | None
) -> torch.Tensor:
    """Reduce ``[N, L]`` per-token values over the True positions of ``mask``.

    - ``token_mean``: sum over every valid token of the batch / their count;
    - ``prompt_mean``: each sequence's mean, then the mean over sequences with a valid token;
    - ``sum_norm``: each sequence's sum / ``max_length_norm``, then the mean over all ``N``
      sequences (Dr. GRPO: no length-dependent normalisation);
    - ``none``: the ``[N, L]`` values, zero at invalid positions.

    Every mode gives 0 when no position is valid.
    """
    if aggregation == "token_mean":
        return masked_mean(per_token, mask)
    if aggregation == "none":
        return torch.where(mask, per_token, torch.zeros_like(per_token))
    sums = per_row_sum(per_token, mask)
    if aggregation == "sum_norm":
        assert max_length_norm is not None
        return (sums / max_length_norm).mean()
    counts = mask.sum(1)
    has_tokens = counts > 0
    means = sums / counts.clamp(min=1)
    return torch.where(has_tokens, means, torch.zeros_like(means)).sum() / has_tokens.sum().clamp(
        min=1
    )
