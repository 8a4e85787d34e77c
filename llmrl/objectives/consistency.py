"""How far the sampler's log-probs are from the trainer's, per row: the log-prob part of the
consistency audit (:mod:`llmrl.train.audit`).

The engine that sampled a response recorded each token's log-prob under its weights
(``log_probs.response``); the trainer's first forward on the batch, before any optimizer step,
scores the same tokens under the weights the engine should hold. With ``d_t = trainer_t -
sampler_t`` over the sampled tokens, each row gives::

    abs_sum  = sum_t |d_t|          tokens  = the number of sampled tokens
    abs_max  = max_t |d_t|          k3_sum  = sum_t exp(d_t) - 1 - d_t

``k3`` estimates ``KL(sampler || trainer)`` from tokens the sampler drew (Schulman's k3:
unbiased, never negative; ``~ d^2 / 2`` for small gaps). The trainer adds the rows of each
engine (:data:`ENGINE_KEY`) over its shard and the ranks, so the audit reports per engine the
mean gap ``sum abs_sum / sum tokens``, the largest ``max abs_max`` and the KL ``sum k3_sum / sum
tokens`` (nats per token).
"""

from __future__ import annotations

import torch

from llmrl.objectives.token_level import k3

ENGINE_KEY = "inference_engine"
"""Where every sampled row records the index of the inference engine that sampled it."""

GAP_COLUMNS = ("abs_sum", "abs_max", "k3_sum", "tokens")
"""The columns of :func:`logprob_gap_rows`."""


@torch.no_grad()
def logprob_gap_rows(
    trainer: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``[N, 4]``: :data:`GAP_COLUMNS` of each row of ``[N, L]`` log-probs over ``mask`` (the
    sampled tokens; elsewhere values are ignored). A row without tokens is all 0."""
    mask = mask.bool()
    gap = torch.where(mask, trainer.detach().float() - sampler.detach().float(), 0.0)
    size = gap.abs()
    return torch.stack(
        [
            size.sum(1),
            size.amax(1) if gap.shape[1] else gap.new_zeros(gap.shape[0]),
            torch.where(mask, k3(gap), 0.0).sum(1),
            mask.sum(1).float(),
        ],
        dim=1,
    )
