"""The skewed-lengths training workload: GRPO's batch shape, where most responses are short and a
few run to the token budget, for timing packed against padded training forwards.

Sampling cannot be told to produce such lengths, and the training phase does not depend on what
the tokens say, so the batch is built: the arithmetic workload's chats (the prompts ``make run``
trains on), ``samples`` responses each of random non-EOS tokens with lengths drawn from
:func:`skewed_lengths`, their sampling log-probs scored once by the model (untimed), and
group-relative advantages of random rewards. :func:`computed_positions` says how many positions
each layout computes and how many of those are padding, from the same layout rules as the
trainer's forward (:mod:`llmrl.policies.packing`, :mod:`llmrl.policies.response_scoring`).
"""

from __future__ import annotations

import random
from typing import Any

import torch
from tensordict import TensorDict

SHORT_SHARE = 0.75
"""Share of responses that end early (uniform over 1/32 to 1/8 of the budget); the rest run to
the budget, as truncated GRPO responses do."""


def skewed_lengths(rows: int, budget: int, seed: int) -> list[int]:
    """Response lengths: ``SHORT_SHARE`` of the rows short, the others at ``budget``, shuffled."""
    rng = random.Random(seed)
    short = round(rows * SHORT_SHARE)
    lengths = [rng.randint(max(1, budget // 32), max(1, budget // 8)) for _ in range(short)]
    lengths += [budget] * (rows - short)
    rng.shuffle(lengths)
    return lengths


def skewed_batch(
    model: Any,
    tokenizer: Any,
    chats: list[list[dict]],
    samples: int,
    budget: int,
    seed: int,
    device: str = "cpu",
) -> TensorDict:
    """``len(chats) x samples`` rows of the skewed workload: tokens, sampling log-probs,
    advantages (see the module docstring); ``model`` lives on ``device``."""
    from llmrl.data import LogProbs, Tokens, tokenize_chats
    from llmrl.policies.response_scoring import score_responses

    generator = torch.Generator().manual_seed(seed)
    rendered = tokenize_chats(chats, tokenizer, add_generation_prompt=True)
    prompts = [row.input_ids for row in rendered.unbind(0) for _ in range(samples)]
    lengths = skewed_lengths(len(prompts), budget, seed)
    eos = tokenizer.eos_token_id
    responses = []
    for length in lengths:
        tokens = torch.randint(0, len(tokenizer), (length,), generator=generator)
        responses.append(torch.where(tokens == eos, tokens + 1, tokens))
    sequences = [torch.cat([p, r]) for p, r in zip(prompts, responses, strict=True)]
    with torch.no_grad():
        scored = score_responses(
            model, sequences, [len(p) for p in prompts], eos, device, share_prompts=False
        ).log_probs.cpu()
    sampled = [row[len(p) : len(s)] for row, p, s in zip(scored, prompts, sequences, strict=True)]
    rewards = torch.rand(len(chats), samples, generator=generator)
    advantages = (rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, keepdim=True)
    return TensorDict(
        {
            "tokens": Tokens.from_sequences(prompt=prompts, response=responses),
            "log_probs": LogProbs.from_sequences(response=sampled),
            "advantage": advantages.reshape(-1),
        },
        batch_size=[len(sequences)],
    )


def computed_positions(batch: TensorDict, packing: bool, share_prompts: bool) -> dict[str, int]:
    """Positions the trainer's scoring forward computes for ``batch`` (``computed``) and the
    real tokens among them (``tokens``), for the layout it takes
    (:func:`~llmrl.policies.response_scoring.plan_scoring`)."""
    from llmrl.policies.packing import pack_sequences
    from llmrl.policies.response_scoring import plan_scoring, shared_token_count

    prompts = batch["tokens"].as_list("prompt")
    responses = batch["tokens"].as_list("response")
    sequences = [torch.cat([p, r]) for p, r in zip(prompts, responses, strict=True)]
    lengths = [len(p) for p in prompts]
    plan = plan_scoring(sequences, lengths, share_prompts=share_prompts, packing=packing)
    if plan.kind == "packed":
        packed = pack_sequences(sequences, lengths, 0)
        return {
            "computed": packed.input_ids.numel(),
            "tokens": packed.input_ids.numel() - packed.padding,
        }
    if plan.kind == "shared":
        real = sum(len(p) - 1 for p in plan.distinct) + sum(1 + len(r) for r in responses)
        return {"computed": shared_token_count(plan.distinct, responses), "tokens": real}
    width = max(lengths) + max(len(r) for r in responses)
    return {"computed": len(sequences) * width, "tokens": sum(len(s) for s in sequences)}
