"""How a rank's minibatch is cut into micro-batches (gradient accumulation), and a batch's groups
into rank shards: by rows, or by a token budget.

- ``micro_batch_size`` (rows): ``m`` contiguous slices whose sizes differ by at most one.
- ``max_tokens_per_micro_batch``: first-fit decreasing of the rows' token counts into
  micro-batches of at most that many tokens (:mod:`llmrl.data.bin_packing`), so one response at
  the budget does not force small micro-batches on every short one; a row longer than the budget
  gets a micro-batch of its own.

Either way the loss is unchanged: every micro-batch backpropagates the sum of its loss terms
(``loss x normalizer``) and the rank divides the summed gradient by the minibatch's global
normalizer once (:class:`~llmrl.train.grpo_trainer.GRPOTrainer`), so any split of a minibatch
gives the gradient of the unsplit one to float rounding. Every rank makes the same number of
passes (the largest any rank needs); the extra ones are empty and score a stand-in row with
weight 0.
"""

from __future__ import annotations

import heapq

import torch
from tensordict import TensorDictBase

from llmrl.data.bin_packing import first_fit_decreasing


def sequence_lengths(batch: TensorDictBase) -> list[int]:
    """Tokens of each row's full sequence (prompt and response), from ``("tokens", "full")`` or,
    without it, the prompt's and the response's."""
    tokens = batch.get("tokens")
    if tokens.has("full"):
        return [len(row) for row in tokens.as_list("full")]
    prompts, responses = tokens.as_list("prompt"), tokens.as_list("response")
    return [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]


def row_plan(rows: int, parts: int) -> list[list[int]]:
    """``rows`` cut into ``parts`` contiguous runs whose sizes differ by at most one (some empty
    when ``parts`` exceeds the rows)."""
    bounds = [round(rows * i / parts) for i in range(parts + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(parts)]


def token_plan(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Rows grouped into micro-batches of at most ``max_tokens`` tokens (first-fit decreasing;
    a longer row alone), each micro-batch's rows in batch order."""
    if not lengths:
        return [[]]
    return first_fit_decreasing(lengths, max_tokens)


def take(batch: TensorDictBase, rows: list[int]) -> TensorDictBase:
    """The rows ``rows`` of ``batch``, in that order: a slice when they are contiguous."""
    if not rows:
        return batch[:0]
    if rows == list(range(rows[0], rows[-1] + 1)):
        return batch[rows[0] : rows[-1] + 1]
    return batch[torch.tensor(rows)]


def balanced_assignment(costs: list[int], parts: int) -> list[list[int]]:
    """Items (group indices) over ``parts`` so that each part's summed cost is as even as the
    longest-processing-time rule makes it: the costliest item first, each to the part with the
    least so far. Each part's items come back in input order; parts with no item are empty."""
    heap = [(0, part) for part in range(parts)]
    assigned: list[list[int]] = [[] for _ in range(parts)]
    for item in sorted(range(len(costs)), key=lambda index: -costs[index]):
        total, part = heapq.heappop(heap)
        assigned[part].append(item)
        heapq.heappush(heap, (total + costs[item], part))
    return [sorted(items) for items in assigned]
