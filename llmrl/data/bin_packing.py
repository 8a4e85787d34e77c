"""First-fit decreasing: items of given sizes into as few bins of a capacity as it finds.

Two users, one algorithm: packed training rows (sequences into rows of at most ``capacity``
tokens, :mod:`llmrl.policies.packing`) and token-budget micro-batches (rows into micro-batches of
at most ``max_tokens_per_micro_batch`` tokens, :mod:`llmrl.train.micro_batches`).

First-fit decreasing takes the items from the largest down and puts each into the first bin it
fits, opening a new bin when none has room. It uses at most ``11/9 OPT + 6/9`` bins (Dósa,
2007), and on GRPO's batches (many short responses, a few long ones) it fills the long items'
bins with short ones: the waste that remains is the last bins' free space.
"""

from __future__ import annotations

from collections.abc import Sequence


def first_fit_decreasing(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``sizes`` grouped into bins whose sizes sum to at most ``capacity``.

    Bins come out in the order they were opened (the first holds the largest item); within a bin,
    indices are ascending. An item larger than ``capacity`` gets a bin of its own (it cannot be
    split: the caller decides whether that is an error). Ties keep the input order, so the result
    is deterministic.

    Example:
        >>> first_fit_decreasing([5, 2, 6, 3], capacity=8)  # 6 | 5, then 3 joins 5, 2 joins 6
        [[1, 2], [0, 3]]
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    order = sorted(range(len(sizes)), key=lambda index: -sizes[index])
    bins: list[list[int]] = []
    free: list[int] = []
    for index in order:
        size = sizes[index]
        if size < 0:
            raise ValueError(f"item {index} has a negative size ({size})")
        for slot, room in enumerate(free):
            if size <= room:
                bins[slot].append(index)
                free[slot] -= size
                break
        else:
            bins.append([index])
            free.append(capacity - size)
    return [sorted(members) for members in bins]
