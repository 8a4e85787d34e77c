"""Log-probs of response tokens only, with gradients: the training forward of GRPO-style losses.

Two savings over scoring every position of every full sequence:

* **Output layer over responses only.** Rows are laid out as in sampling (left-padded prompts,
  right-padded responses), so every response starts at the same column and the output layer
  and log-softmax run over the response columns alone (``logits_to_keep``).
* **Shared prompts computed once.** GRPO scores G responses to each prompt. When rows share a
  prompt, the prompt (all but its last token) goes through the model once per distinct prompt
  with a KV cache; the cache is indexed out to every row (gradients flow back through the
  indexing into the one prompt pass), and only ``last prompt token + response`` is computed
  per row. With G = 4 and prompts as long as responses this removes ~35% of the tokens of the
  forward and backward passes.

Both give the log-probs of the plain full pass (to float rounding) in its right-padded layout:
row ``i``'s response log-probs start at column ``prompt_lengths[i]``; other positions hold 0.
With ``log_prob_chunk_size`` set, the output layer runs over chunks of positions
(:mod:`llmrl.policies.chunked_log_probs`): the full ``[rows, positions, vocab]`` logits never
exist, in forward or backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from llmrl.data import pad_sequences
from llmrl.models.sharding import is_fully_sharded
from llmrl.policies.base import ScoreResult
from llmrl.policies.chunked_log_probs import (
    DEFAULT_LOG_PROB_CHUNK_SIZE,
    forward_log_probs,
    log_probs_from_logits,
)
from llmrl.policies.packing import packed_token_count, score_packed
from llmrl.policies.prompt_cache import distinct_rows


def score_responses(
    model: Any,
    sequences: list[torch.Tensor],
    prompt_lengths: list[int],
    pad_token_id: int,
    device: torch.device | str,
    *,
    log_prob_chunk_size: int | None = DEFAULT_LOG_PROB_CHUNK_SIZE,
    with_entropy: bool = False,
    share_prompts: bool = True,
    packing: bool = False,
) -> ScoreResult:
    """``[N, max len]`` log-probs of each sequence's response tokens (0 elsewhere), and their
    entropies (same layout) when asked.

    Every prompt must be at least one token long and some response non-empty. The output layer
    runs over ``log_prob_chunk_size`` positions at a time (None: all at once, as full logits).
    ``share_prompts=False`` always takes one pass: needed under activation checkpointing, whose
    recomputed layers would append to the shared KV cache a second time. An FSDP2 model gets
    one pass too (it frees gathered weights after each forward, so two forwards cannot share
    one backward).

    ``packing=True`` (the caller has checked the model can, :func:`~llmrl.policies.packing.
    packing_problem`) scores packed rows (:mod:`llmrl.policies.packing`), unless the rows share
    prompts and sharing them computes fewer positions: packed rows hold every row's own copy of
    its prompt, so G responses to one long prompt with short answers cost less shared than
    packed.
    """
    share_prompts = share_prompts and not is_fully_sharded(model)
    plan = plan_scoring(sequences, prompt_lengths, share_prompts=share_prompts, packing=packing)
    prompts, responses, distinct = plan.prompts, plan.responses, plan.distinct
    if plan.kind == "packed":
        return score_packed(
            model,
            sequences,
            prompt_lengths,
            pad_token_id,
            device,
            log_prob_chunk_size=log_prob_chunk_size,
            with_entropy=with_entropy,
        )
    head = (log_prob_chunk_size, with_entropy)
    if plan.kind == "shared":
        log_probs, entropy, response_mask = _shared_prompts(
            model, distinct, plan.row_to_prompt, responses, pad_token_id, device, head
        )
    else:
        log_probs, entropy, response_mask = _one_pass(
            model, prompts, responses, pad_token_id, device, head
        )
    width = max(len(s) for s in sequences)

    def laid_out(values: torch.Tensor) -> torch.Tensor:
        return _full_layout(values.masked_fill(~response_mask, 0.0), prompt_lengths, width)

    return ScoreResult(
        log_probs=laid_out(log_probs), entropy=laid_out(entropy) if entropy is not None else None
    )


@dataclass(frozen=True)
class ScoringPlan:
    """Which forward :func:`score_responses` takes (``kind``: ``"packed"``, ``"shared"``: each
    distinct prompt once, or ``"one_pass"``: padded rows), and the rows cut the way it uses
    them: ``prompts``, ``responses``, the ``distinct`` prompts and each row's index among them."""

    kind: str
    prompts: list[torch.Tensor]
    responses: list[torch.Tensor]
    distinct: list[torch.Tensor]
    row_to_prompt: list[int]


def plan_scoring(
    sequences: list[torch.Tensor], prompt_lengths: list[int], *, share_prompts: bool, packing: bool
) -> ScoringPlan:
    """The forward for these rows: packed when ``packing`` and it computes no more positions
    than sharing the prompts (when rows share prompts of more than one token and
    ``share_prompts``); else shared, else one padded pass."""
    prompts = [s[:n] for s, n in zip(sequences, prompt_lengths, strict=True)]
    responses = [s[n:] for s, n in zip(sequences, prompt_lengths, strict=True)]
    firsts, row_to_prompt = distinct_rows(prompts)
    distinct = [prompts[i] for i in firsts]
    shareable = len(distinct) < len(prompts) and min(len(p) for p in distinct) > 1
    shares = shareable and share_prompts
    shared = shared_token_count(distinct, responses) if shares else math.inf
    if packing and packed_token_count([len(s) for s in sequences]) <= shared:
        kind = "packed"
    else:
        kind = "shared" if shares else "one_pass"
    return ScoringPlan(kind, prompts, responses, distinct, row_to_prompt)


def shared_token_count(distinct: list[torch.Tensor], responses: list[torch.Tensor]) -> int:
    """Positions the shared-prompt forward computes: each distinct prompt but its last token
    (left-padded), then per row the last prompt token and its response (right-padded)."""
    prefix = len(distinct) * (max(len(p) for p in distinct) - 1)
    return prefix + len(responses) * (1 + max(len(r) for r in responses))


def _one_pass(
    model: Any,
    prompts: list[torch.Tensor],
    responses: list[torch.Tensor],
    pad_token_id: int,
    device: torch.device | str,
    head: tuple[int | None, bool],
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Prompt + response in one forward, the output layer over the response columns:
    ``[N, R]`` log-probs, entropies (or None) and the response mask. ``head`` is
    ``(log_prob_chunk_size, with_entropy)``."""
    prompt_ids, prompt_mask = pad_sequences(prompts, "left", pad_token_id)
    response_ids, response_mask = pad_sequences(responses, "right", pad_token_id)
    width = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1).to(device)
    mask = torch.cat([prompt_mask, response_mask], dim=1).to(device)
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    # the last `width + 1` columns: the last prompt token predicts the first response token,
    # the last column predicts nothing (its target is a placeholder)
    targets = F.pad(response_ids, (0, 1), value=pad_token_id).to(device)
    log_probs, entropy = _kept_log_probs(
        model,
        targets,
        head,
        input_ids=input_ids,
        attention_mask=mask.long(),
        position_ids=position_ids,
        logits_to_keep=width + 1,
        use_cache=False,  # nothing reuses it, and activation checkpointing can then recompute
    )
    return log_probs, entropy, response_mask.to(device)


def _shared_prompts(
    model: Any,
    distinct: list[torch.Tensor],
    row_to_prompt: list[int],
    responses: list[torch.Tensor],
    pad_token_id: int,
    device: torch.device | str,
    head: tuple[int | None, bool],
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Each distinct prompt's KV once (all but its last token), then per row the last prompt
    token and the response on top of that cache (returns as :func:`_one_pass`)."""
    from transformers import DynamicCache

    prefix_ids, prefix_mask = pad_sequences([p[:-1] for p in distinct], "left", pad_token_id)
    prefix_ids, prefix_mask = prefix_ids.to(device), prefix_mask.to(device)
    cache = DynamicCache()
    model(
        input_ids=prefix_ids,
        attention_mask=prefix_mask.long(),
        position_ids=(prefix_mask.long().cumsum(-1) - 1).clamp(min=0),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,  # the prefix needs no output layer
    )
    rows = torch.tensor(row_to_prompt, device=device)
    cache.batch_select_indices(rows)  # [U, ...] -> [N, ...]; backward sums into the U rows

    last = [p[-1:] for p in distinct]
    suffixes = [torch.cat([last[u], r]) for u, r in zip(row_to_prompt, responses, strict=True)]
    suffix_ids, suffix_mask = pad_sequences(suffixes, "right", pad_token_id)
    suffix_ids, suffix_mask = suffix_ids.to(device), suffix_mask.to(device)
    mask = torch.cat([prefix_mask[rows], suffix_mask], dim=1)
    prefix_length = prefix_mask[rows].long().sum(-1, keepdim=True)
    position_ids = prefix_length + torch.arange(suffix_ids.shape[1], device=device)
    log_probs, entropy = _kept_log_probs(
        model,
        F.pad(suffix_ids[:, 1:], (0, 1), value=pad_token_id),  # the last column predicts nothing
        head,
        input_ids=suffix_ids,
        attention_mask=mask.long(),
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
    )
    return log_probs, entropy, suffix_mask[:, 1:]


def _kept_log_probs(
    model: Any, targets: torch.Tensor, head: tuple[int | None, bool], **inputs: Any
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of ``targets`` at the kept positions but the last."""
    chunk_size, with_entropy = head
    log_probs, entropy = forward_log_probs(
        model, targets, chunk_size=chunk_size, with_entropy=with_entropy, **inputs
    )
    return log_probs[:, :-1], entropy[:, :-1] if entropy is not None else None


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[target]`` per position, in float32."""
    return log_probs_from_logits(logits, targets)[0]


def _full_layout(
    response_log_probs: torch.Tensor, prompt_lengths: list[int], width: int
) -> torch.Tensor:
    """Response-aligned ``[N, R]`` values placed at each row's prompt length in ``[N, width]``."""
    device = response_log_probs.device
    columns = torch.arange(width, device=device)
    offset = columns - torch.tensor(prompt_lengths, device=device).unsqueeze(1)
    span = response_log_probs.shape[1]
    inside = (offset >= 0) & (offset < span)
    return response_log_probs.gather(1, offset.clamp(0, span - 1)).masked_fill(~inside, 0.0)
