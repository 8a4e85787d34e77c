"""Padded <-> ragged conversion for token-aligned tensors.

Convention everywhere in llmrl: prompts are **left**-padded (so every prompt ends at the same
column and generation continues from there), responses are **right**-padded, and a padded full
sequence is ``cat(left-padded prompt, right-padded response)``, so the response starts at the same
column in every row. Validity is always carried by an explicit boolean mask, never inferred from
pad ids: SmolLM2 and Qwen use their end-of-turn token as pad token, and a real end-of-turn must
not be mistaken for padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

PaddingSide = Literal["left", "right"]


def pad_sequences(
    sequences: Sequence[torch.Tensor], side: PaddingSide, value: float | int | bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D (or ``[L, ...]``) tensors of different lengths into ``[B, L_max, ...]``.

    Returns the padded tensor and a boolean mask of the real positions.

    Example:
        >>> padded, mask = pad_sequences([torch.tensor([1, 2]), torch.tensor([3])], "left", 0)
        >>> padded.tolist(), mask.tolist()
        ([[1, 2], [0, 3]], [[True, True], [False, True]])
    """
    if side not in ("left", "right"):
        raise ValueError(f"padding side must be 'left' or 'right', got {side!r}")
    if not sequences:
        raise ValueError("pad_sequences needs at least one sequence")
    first = sequences[0]
    max_len = max(seq.shape[0] for seq in sequences)
    padded = first.new_full((len(sequences), max_len, *first.shape[1:]), value)
    mask = torch.zeros(len(sequences), max_len, dtype=torch.bool, device=first.device)
    for row, seq in enumerate(sequences):
        length = seq.shape[0]
        columns = slice(max_len - length, max_len) if side == "left" else slice(0, length)
        padded[row, columns] = seq
        mask[row, columns] = True
    return padded, mask


def unpad_sequences(padded: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Inverse of :func:`pad_sequences`: the real positions of each row, in order."""
    if padded.shape[:2] != mask.shape:
        raise ValueError(
            f"mask shape {list(mask.shape)} does not match the first two dims of the padded "
            f"tensor {list(padded.shape)}"
        )
    return [row[row_mask] for row, row_mask in zip(padded, mask.bool(), strict=True)]
