"""Train/inference mismatch correction: importance weights between the sampler and the trainer.

The engine that sampled a batch (vLLM, a bf16 copy, an older version) does not compute exactly
the trainer's probabilities. Each trained token's importance ratio between the two is
``rho_t = exp(old_t - inference_t)`` (the trainer's log-prob of the sampled token before the
update, minus the sampler's). A correction multiplies each token's objective by a detached
weight built from it, at one of two levels and in one of two modes:

- token, truncate: ``w_t = min(rho_t, threshold)`` (truncated importance sampling, TIS);
- token, mask: ``w_t = rho_t``, and a token whose ``rho_t`` lies outside
  ``[1/threshold, threshold]`` is dropped (weight 0);
- sequence, truncate: ``w_i = min(prod_t rho_t, threshold)`` for every token of sequence ``i``;
- sequence, mask: ``w_i = prod_t rho_t``, and a sequence whose product lies outside the band is
  dropped.

The sequence ratio is the product over the sequence's trained tokens (the importance weight of
the whole sampled response). ``fraction`` says how much the correction acted on: the share of
trained tokens (token level) or of sequences with a trained token (sequence level) that were
truncated or dropped; the stages log it as ``mismatch_corrected_fraction``. Dropped tokens keep
their place in the aggregation's denominator (they contribute 0), so the loss scale does not
jump when a few are dropped.

Example:
    weights = MismatchCorrection("sequence", "mask", 2.0).weights(old, inference, mask)
    objective = objective * weights.weight
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

LEVELS: tuple[str, ...] = ("token", "sequence")
MODES: tuple[str, ...] = ("truncate", "mask")


class MismatchWeights(NamedTuple):
    """``weight``: ``[N, L]`` detached factors (0 where dropped or untrained); ``fraction``: the
    share of tokens or sequences truncated or dropped (a 0-d tensor)."""

    weight: torch.Tensor
    fraction: torch.Tensor


@dataclass(frozen=True)
class MismatchCorrection:
    """One correction of the sampler/trainer mismatch (see the module docstring).

    Args:
        level: ``"token"`` (one ratio per token) or ``"sequence"`` (the product over the
            sequence's trained tokens).
        mode: ``"truncate"`` (cap the weight at ``threshold``) or ``"mask"`` (drop what lies
            outside ``[1/threshold, threshold]``).
        threshold: > 1 for ``mask``, > 0 for ``truncate``.

    Raises:
        ValueError: an unknown level or mode, or a threshold out of range (named).
    """

    level: Literal["token", "sequence"] = "token"
    mode: Literal["truncate", "mask"] = "truncate"
    threshold: float = 2.0

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"mismatch level must be one of {list(LEVELS)}, got {self.level!r}")
        if self.mode not in MODES:
            raise ValueError(f"mismatch mode must be one of {list(MODES)}, got {self.mode!r}")
        lowest = 1.0 if self.mode == "mask" else 0.0
        if not (math.isfinite(self.threshold) and self.threshold > lowest):
            raise ValueError(
                f"mismatch threshold must be a finite number > {lowest:g} for mode "
                f"{self.mode!r}, got {self.threshold}"
            )

    @torch.no_grad()
    def weights(
        self, old: torch.Tensor, inference: torch.Tensor, mask: torch.Tensor
    ) -> MismatchWeights:
        """The weights of ``[N, L]`` log-probs ``old`` (trainer) and ``inference`` (sampler)
        over the trained tokens ``mask``."""
        mask = mask.bool()
        log_ratio = torch.where(mask, old - inference, torch.zeros_like(old))
        if self.level == "sequence":
            log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(old)
        ratio = log_ratio.exp()
        if self.mode == "truncate":
            weight = ratio.clamp(max=self.threshold)
            acted = ratio > self.threshold
        else:
            bound = math.log(self.threshold)
            acted = (log_ratio > bound) | (log_ratio < -bound)
            weight = torch.where(acted, torch.zeros_like(ratio), ratio)
        weight = torch.where(mask, weight, torch.zeros_like(weight))
        if self.level == "sequence":
            rows = mask.any(dim=1)
            fraction = _share(acted[:, 0] & rows, rows)
        else:
            fraction = _share(acted & mask, mask)
        return MismatchWeights(weight, fraction)


def _share(flags: torch.Tensor, population: torch.Tensor) -> torch.Tensor:
    count = population.sum()
    if count == 0:
        return flags.new_zeros((), dtype=torch.float32)
    return flags.sum().float() / count.float()
