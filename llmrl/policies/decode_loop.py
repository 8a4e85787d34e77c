"""llmrl's own sampling loop for transformers models: what ``generate`` does, minus its waste.

Profiled on the rollout benchmark (SmolLM2-135M, 32 rows, 2 CPU threads; the profile:
benchmarks/README.md#what-the-numbers-say), ``generate`` spends a sizeable share of a decode
step drawing one token per row: its ``torch.multinomial`` draws an exponential variate for
every vocabulary entry (1.5 M per step). It also keeps every step's ``[rows, vocab]`` logits for
the log-probs, and keeps computing rows that have ended.
This loop instead:

- draws by inverse CDF: one uniform number per row, searched in the cumulative probabilities;
- takes each sampled token's log-prob (raw logits, temperature 1) inside the loop;
- drops rows from the batch (and their KV cache) once they have emitted an end token.

The draws follow the same distribution as ``generate`` (temperature, then top-k, then top-p,
as its logits processors apply them) from a different random stream; greedy decoding picks
the same tokens. Settings it does not implement (``repetition_penalty``) go to ``generate``,
which then draws with :class:`InverseCDFDraw`: the same filters and draw, as a logits processor.

A ``torch.Generator`` passed in is the only random state a draw uses (a seeded call then
leaves the global CPU and CUDA generators alone); without one the draws use the global one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from llmrl.policies.generation_kwargs import GenerationKwargs
from llmrl.policies.prompt_cache import common_prefix_cache, prompt_prefix_cache
from llmrl.policies.response_scoring import token_log_probs


def supports(config: GenerationKwargs) -> bool:
    """Whether :func:`decode` implements every setting of ``config``."""
    return config.repetition_penalty == 1.0


def filtered_logits(logits: torch.Tensor, config: GenerationKwargs) -> torch.Tensor:
    """``[N, V]`` float logits after temperature, top-k and top-p (removed entries: -inf)."""
    if config.effective_temperature != 1.0:
        logits = logits / config.effective_temperature
    if config.top_k is not None and config.top_k < logits.shape[-1]:
        kth = logits.topk(config.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        # keep the most probable tokens whose mass reaches top_p (at least one)
        ascending, order = logits.sort(dim=-1)
        below = ascending.softmax(-1).cumsum(-1) <= 1 - config.top_p
        below[:, -1] = False
        logits = logits.masked_fill(below.scatter(-1, order, below), float("-inf"))
    return logits


def next_tokens(
    logits: torch.Tensor, config: GenerationKwargs, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``[N]`` tokens: the argmax when greedy, else one inverse-CDF draw per row (uniforms from
    ``generator``, on the logits' device; None: the global generator)."""
    if not config.do_sample:
        return logits.argmax(-1)
    probs = filtered_logits(logits, config).softmax(-1)
    cdf = probs.cumsum(-1)
    uniform = torch.rand(len(cdf), 1, device=cdf.device, dtype=cdf.dtype, generator=generator)
    return torch.searchsorted(cdf, uniform * cdf[:, -1:]).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


class InverseCDFDraw:
    """llmrl's draw as a ``generate`` logits processor, for ``generate`` run greedy.

    ``generate`` takes no ``torch.Generator``, so a seeded call runs it with
    ``do_sample=False`` and this last processor: it filters and draws like :func:`next_tokens`
    with our generator and returns scores that are -inf everywhere but the drawn token, which
    the greedy argmax then picks. ``output_logits`` stay the raw logits, so log-probs are
    taken as for any ``generate`` call; processors run eagerly, outside the compiled step.
    """

    def __init__(self, config: GenerationKwargs, generator: torch.Generator | None) -> None:
        self.config = config
        self.generator = generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        chosen = next_tokens(scores.float(), self.config, self.generator)
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(-1, chosen[:, None], 0.0)


@torch.no_grad()
def decode(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    config: GenerationKwargs,
    eos_token_ids: set[int],
    pad_token_id: int,
    generator: torch.Generator | None = None,
    share_prefix: bool = False,
    stop: Callable[[torch.Tensor], bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample up to ``config.max_new_tokens`` after each left-padded prompt row, drawing from
    ``generator`` (None: the global generator). ``share_prefix``: prefill the token prefix that
    all rows share once (:func:`~llmrl.policies.prompt_cache.common_prefix_cache`), else each
    distinct row once. ``stop(ended)``, asked after each step with the ``[N]`` rows that ended
    so far: true returns now, the rows still going cut where they are.

    Returns ``[N, T]`` generated ids (``pad_token_id`` after a row's end token; ``T``: the
    steps run) and the log-prob of each under the raw logits (0 where padded).
    """
    rows, steps = len(input_ids), config.max_new_tokens
    device = input_ids.device
    # every prompt token but the last, which the first step feeds
    common = common_prefix_cache(model, input_ids, attention_mask) if share_prefix else None
    if common is not None:
        cache, mask = common
        mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
    else:
        cache = prompt_prefix_cache(model, input_ids, attention_mask)
        mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -1:]
    current = input_ids[:, -1:]
    eos = torch.tensor(sorted(eos_token_ids), device=device)
    live = torch.arange(rows, device=device)  # the original row of each row still decoding
    done = torch.zeros(rows, dtype=torch.bool, device=device)  # rows that ended (for stop)
    tokens = torch.full((rows, steps), pad_token_id, dtype=input_ids.dtype, device=device)
    log_probs = torch.zeros(rows, steps, device=device)
    for step in range(steps):
        logits = (
            model(
                input_ids=current,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            .logits[:, -1]
            .float()
        )
        chosen = next_tokens(logits, config, generator)
        tokens[live, step] = chosen
        log_probs[live, step] = token_log_probs(logits, chosen)
        ended = torch.isin(chosen, eos)
        if ended.all() or step == steps - 1:
            break
        if stop is not None:
            done[live[ended]] = True
            if stop(done):
                return tokens[:, : step + 1], log_probs[:, : step + 1]
        if ended.any():  # drop finished rows: every later step computes only the live ones
            keep = (~ended).nonzero().squeeze(-1)
            live, chosen, mask, positions = live[keep], chosen[keep], mask[keep], positions[keep]
            cache.batch_select_indices(keep)
        current = chosen[:, None]
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
        positions = positions + 1
    return tokens, log_probs
