"""Prompts shared by several rows, computed once.

GRPO samples G responses per prompt, so a generation batch holds each prompt G times (as
repeated rows, or through ``num_return_sequences``). :func:`shared_prompt_cache` runs each
distinct prompt through the model once (all but its last token) and hands ``generate`` a KV cache
indexed out to every row: the prefill costs 1/G of its usual time and the samples are drawn
exactly as before (same rows, same order, same random stream).
"""

from __future__ import annotations

from typing import Any

import torch


def distinct_rows(rows: list[torch.Tensor]) -> tuple[list[int], list[int]]:
    """Indices of the distinct rows (first-seen order) and each row's index among them."""
    index: dict[tuple[int, ...], int] = {}
    firsts, owners = [], []
    for position, row in enumerate(rows):
        key = tuple(row.tolist())
        if key not in index:
            index[key] = len(firsts)
            firsts.append(position)
        owners.append(index[key])
    return firsts, owners


@torch.no_grad()
def shared_prompt_cache(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> Any | None:
    """A KV cache of ``input_ids[:, :-1]`` (left-padded ``[N, W]``) computed once per distinct
    row, or None when every row is distinct (nothing to share) or the prompts are one token.

    ``generate(input_ids, attention_mask, past_key_values=cache)`` then starts from the last
    prompt token of every row.
    """
    if input_ids.shape[1] < 2:
        return None
    firsts, owners = distinct_rows(list(input_ids))
    if len(firsts) == len(owners):
        return None
    return _prefix_cache(model, input_ids, attention_mask, firsts, owners)


@torch.no_grad()
def prompt_prefix_cache(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, share: bool = True
) -> Any:
    """Like :func:`shared_prompt_cache`, but always a cache: every row's ``input_ids[:, :-1]``
    (empty for one-token prompts), each distinct row computed once unless ``share`` is False."""
    from transformers import DynamicCache

    if input_ids.shape[1] < 2:
        return DynamicCache()
    if share:
        firsts, owners = distinct_rows(list(input_ids))
    else:
        firsts = owners = list(range(len(input_ids)))
    return _prefix_cache(model, input_ids, attention_mask, firsts, owners)


def _prefix_cache(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    firsts: list[int],
    owners: list[int],
) -> Any:
    """The prefix (all but the last column) of rows ``firsts`` through the model, its KV cache
    indexed out so that row ``i`` holds that of ``firsts[owners[i]]``."""
    from transformers import DynamicCache

    firsts_t = torch.tensor(firsts, device=input_ids.device)
    prefix, mask = input_ids[firsts_t, :-1], attention_mask[firsts_t, :-1].long()
    cache = DynamicCache()
    model(
        input_ids=prefix,
        attention_mask=mask,
        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    if len(firsts) < len(owners):
        cache.batch_select_indices(torch.tensor(owners, device=input_ids.device))
    return cache
