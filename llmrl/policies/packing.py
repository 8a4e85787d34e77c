"""Padding-free scoring: sequences packed end to end into a few rows, attention kept within each.

A padded batch computes ``rows x longest`` positions; GRPO's responses range from a few tokens to
the budget, so most of those can be padding. Here the sequences are laid end to end into rows of
at most ``capacity`` tokens (the longest sequence's length: first-fit decreasing,
:mod:`llmrl.data.bin_packing`), with ``position_ids`` restarting at 0 at each sequence and no
attention mask. transformers 5 reads such ``position_ids`` as packed sequences: its masking
utilities confine attention to each sequence for ``sdpa``, ``eager`` and ``flex_attention``, and
``flash_attention_2/3`` run their varlen kernels on the sequences the position ids delimit.
Nothing here computes attention.

Rows of at most the longest sequence keep each row's attention cost at most a padded row's
(``sdpa`` and ``eager`` build a dense ``[row, row]`` mask), while the positions computed drop
from ``rows x longest`` to about the tokens themselves; the last rows' free space is the only
padding left.

Only the positions that predict a scored token reach the output layer (``keep`` of
:func:`~llmrl.policies.chunked_log_probs.forward_log_probs`), and the values come back in the
padded layout every caller uses: token ``t`` of row ``i``'s value at ``[i, t]``, 0 elsewhere.

Packing is refused, and the caller scores padded, for a model it would silently get wrong:
:func:`packing_problem` checks the attention implementation and then runs a probe (two short
sequences packed against the second alone) once per model.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from llmrl.data.bin_packing import first_fit_decreasing
from llmrl.models.layers import unwrapped
from llmrl.policies.base import ScoreResult
from llmrl.policies.chunked_log_probs import forward_log_probs

logger = logging.getLogger(__name__)

PACKING_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")
"""Attention implementations that transformers confines to each packed sequence."""


@dataclass(frozen=True)
class PackedRows:
    """Sequences laid end to end into ``[P, C]`` rows.

    ``scored`` marks the positions whose next-token prediction is wanted, ``targets`` holds that
    next token there; ``rows[k]`` and ``tokens[k]`` say which sequence and which of its tokens
    the ``k``-th scored position (in row-major order) predicts. ``padding`` counts the positions
    that hold no token (the rows' free tails).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    scored: torch.Tensor
    rows: torch.Tensor
    tokens: torch.Tensor
    padding: int


def pack_sequences(
    sequences: list[torch.Tensor],
    first_scored: list[int],
    pad_token_id: int,
    capacity: int | None = None,
) -> PackedRows:
    """Pack 1-D token ``sequences`` into rows of ``capacity`` tokens (default: the longest).

    Token ``t`` of sequence ``i`` is scored for ``first_scored[i] <= t < len``; each
    ``first_scored[i]`` must be at least 1 (token 0 has no prediction). A row's free tail holds
    ``pad_token_id`` with positions restarting at 0, a sequence of its own whose outputs nobody
    reads.
    """
    lengths = [len(s) for s in sequences]
    if not sequences or min(lengths) < 1:
        raise ValueError("packing needs at least one sequence, each at least one token long")
    if min(first_scored) < 1:
        raise ValueError(f"first_scored must be >= 1 (token 0 has no prediction): {first_scored}")
    capacity = capacity or max(lengths)
    if max(lengths) > capacity:
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit rows of {capacity}")
    bins = first_fit_decreasing(lengths, capacity)
    input_ids = torch.full((len(bins), capacity), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(bins), capacity), dtype=torch.long)
    targets = torch.full_like(input_ids, pad_token_id)
    scored = torch.zeros_like(input_ids, dtype=torch.bool)
    rows: list[torch.Tensor] = []
    tokens: list[torch.Tensor] = []
    used = 0
    for row, members in enumerate(bins):
        start = 0
        for index in members:
            sequence, length, first = sequences[index], lengths[index], first_scored[index]
            span = slice(start, start + length)
            input_ids[row, span] = sequence
            position_ids[row, span] = torch.arange(length)
            # position t predicts token t + 1: the scored tokens first..length-1
            predicting = slice(start + first - 1, start + length - 1)
            targets[row, predicting] = sequence[first:]
            scored[row, predicting] = True
            start += length
        tail = capacity - start
        position_ids[row, start:] = torch.arange(tail)
        used += start
        # the scored positions of this row, in row-major order, and which token each predicts
        rows_here, tokens_here = _scored_owners(members, lengths, first_scored)
        rows.append(rows_here)
        tokens.append(tokens_here)
    return PackedRows(
        input_ids=input_ids,
        position_ids=position_ids,
        targets=targets,
        scored=scored,
        rows=torch.cat(rows),
        tokens=torch.cat(tokens),
        padding=len(bins) * capacity - used,
    )


def _scored_owners(
    members: list[int], lengths: list[int], first_scored: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """For one packed row: the sequence and token index of each scored position, in order."""
    rows = [torch.full((lengths[i] - first_scored[i],), i, dtype=torch.long) for i in members]
    tokens = [torch.arange(first_scored[i], lengths[i]) for i in members]
    return torch.cat(rows), torch.cat(tokens)


def packed_token_count(lengths: list[int]) -> int:
    """Positions a packed forward computes for sequences of ``lengths`` (rows of the longest)."""
    capacity = max(lengths)
    return len(first_fit_decreasing(lengths, capacity)) * capacity


def score_packed(
    model: Any,
    sequences: list[torch.Tensor],
    first_scored: list[int],
    pad_token_id: int,
    device: torch.device | str,
    *,
    log_prob_chunk_size: int | None,
    with_entropy: bool = False,
) -> ScoreResult:
    """``[N, max len]`` log-probs (and entropies) of tokens ``first_scored[i]..`` of each
    sequence, 0 elsewhere, from one forward over packed rows (see the module docstring)."""
    packed = pack_sequences(sequences, first_scored, pad_token_id)
    scored = packed.scored.to(device)
    log_probs, entropy = forward_log_probs(
        model,
        packed.targets.to(device),
        chunk_size=log_prob_chunk_size,
        with_entropy=with_entropy,
        keep=scored,
        input_ids=packed.input_ids.to(device),
        position_ids=packed.position_ids.to(device),
        use_cache=False,  # a cache would turn transformers' packed-sequence detection off
    )
    shape = (len(sequences), max(len(s) for s in sequences))
    index = (packed.rows.to(device), packed.tokens.to(device))

    def laid_out(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(shape).index_put(index, values)

    return ScoreResult(
        log_probs=laid_out(log_probs), entropy=laid_out(entropy) if entropy is not None else None
    )


_PROBLEMS: weakref.WeakKeyDictionary[torch.nn.Module, str | None] = weakref.WeakKeyDictionary()


def packing_problem(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot score packed sequences (None when it can); checked once per model.

    The attention implementation must be one transformers confines to packed sequences
    (:data:`PACKING_ATTENTION`), and a probe must agree: the second of two packed sequences gets
    the logits it gets alone. The probe catches what the name cannot (layers that carry state
    across the row, such as state-space or linear-attention layers, or a model whose attention
    ignores ``position_ids``); it costs four forwards of a few tokens, once. Any difference above
    the model's own rounding at the packed shape refuses packing, however small the leak.
    """
    base = unwrapped(model)
    if base in _PROBLEMS:
        return _PROBLEMS[base]
    config = getattr(base, "config", None)
    attention = getattr(config, "_attn_implementation", None)
    if attention not in PACKING_ATTENTION:
        problem = (
            f"attention implementation {attention!r} does not confine attention to packed "
            f"sequences (transformers does so for {', '.join(PACKING_ATTENTION)})"
        )
    else:
        problem = _probe(model)
    _PROBLEMS[base] = problem
    if problem is not None:
        logger.warning("packing off for %s: %s; scoring padded rows", type(base).__name__, problem)
    return problem


@torch.no_grad()
def _probe(model: torch.nn.Module) -> str | None:
    """Logits of sequence B packed after sequence A against B alone and B after A unpacked
    (autocast off: in the weights' own precision, where rounding is smallest)."""
    device = next(model.parameters()).device
    with torch.autocast(device.type, enabled=False):
        return _probe_logits(model, device)


def _probe_logits(model: torch.nn.Module, device: torch.device) -> str | None:
    vocab = int(getattr(unwrapped(model).config, "vocab_size", 32))
    first = torch.tensor([[3, 5, 7, 11]]) % vocab
    second = torch.tensor([[13, 17, 19]]) % vocab

    def logits(ids: torch.Tensor, positions: list[int], rows: slice) -> torch.Tensor:
        out = model(
            input_ids=ids.to(device),
            position_ids=torch.tensor([positions], device=device),
            use_cache=False,
        )
        return out.logits[0, rows].float()

    restart = [0, 1, 2, 3, 0, 1, 2]
    alone = logits(second, [0, 1, 2], slice(0, 3))
    packed = logits(torch.cat([first, second], dim=1), restart, slice(4, 7))
    # B first, A after it, in the packed forward's shape: a causal model cannot see what
    # follows, so B's logits differ from `alone` by this model's rounding at that shape alone
    # (kernels block reductions by shape), whatever its layers are.
    shaped = logits(torch.cat([second, first], dim=1), list(range(7)), slice(0, 3))
    # B attending to A: what a leak would look like
    leaked = logits(torch.cat([first, second], dim=1), list(range(7)), slice(4, 7))
    gap = float((packed - alone).abs().max())
    noise = float((shaped - alone).abs().max())
    leak = float((leaked - alone).abs().max())
    scale = float(alone.abs().max())
    # The packed forward differs from B alone by a reordering of its reductions at the packed
    # shape: |packed - alone| <= |packed - shaped| + |shaped - alone|, two roundings of the kind
    # `noise` measures. Below that, a floor for reordered sums in the weights' precision (where
    # `noise` happens to be exactly 0). Any gap above is state crossing from A into B, however
    # small next to `leak` (a convolution or recurrent layer leaks a fraction of it).
    floor = 1e-2 * (1 + scale) if _half_precision(model) else 1e-4 * (1 + scale)
    rounding = max(floor, 2 * noise)
    if gap > rounding:
        return (
            "its outputs for a packed sequence depend on the sequence before it (probe: logits "
            f"off by {gap:.3g}, above this model's rounding {rounding:.3g}; no packing at all "
            f"is off by {leak:.3g})"
        )
    return None


def _half_precision(model: torch.nn.Module) -> bool:
    """Whether the probe's forward computes in a 16-bit type (the weights')."""
    return next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
