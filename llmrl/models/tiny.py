"""Tiny random Llama models that share SmolLM2's real tokenizer, for fast tests and benchmarks:
:func:`tiny_model`, and :func:`ending_model`, whose replies end with EOS at a set rate."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from llmrl.models.loading import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def tiny_model(
    tokenizer: PreTrainedTokenizerBase | None = None,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> PreTrainedModel:
    """A randomly initialised Llama with the vocabulary of ``tokenizer`` (default: SmolLM2's).

    Deterministic for a given ``seed`` and leaves the global RNG untouched. Returned in eval mode.

    Example:
        >>> model = tiny_model(num_layers=2, hidden_size=64)
        >>> model.config.vocab_size
        49152
    """
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
    model = _random_llama(
        tokenizer,
        seed,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        tie_word_embeddings=True,
    )
    return model.to(dtype).eval()


def _random_llama(tokenizer: PreTrainedTokenizerBase, seed: int, **shape: Any) -> PreTrainedModel:
    """A Llama of ``shape`` over ``tokenizer``'s vocabulary, initialised from ``seed`` (the
    global RNG untouched)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


ENDING_LEVEL = 30.0
"""Dimension 0 of every embedding of an :func:`ending_model` (the others are initialised at
std 0.02)."""


def ending_model(
    tokenizer: PreTrainedTokenizerBase,
    eos_prob: float,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
) -> PreTrainedModel:
    """A tiny random Llama (untied embeddings, eval mode) whose replies end with EOS at
    ``eos_prob`` a token, from any engine: ragged, skewed lengths (geometric, cut at the
    budget: most short, ``(1 - eos_prob) ** budget`` of them at it).

    How: every token's embedding holds :data:`ENDING_LEVEL` in dimension 0, which dominates the
    residual stream, so the final RMSNorm's output holds about ``sqrt(hidden_size)`` there and
    little elsewhere; every logit but EOS's is then close to 0 (a near-uniform draw over the
    vocabulary), and EOS's, ``lm_head[eos, 0] * sqrt(hidden_size)``, is set so that EOS has
    probability ``eos_prob``. Heads of 32 dimensions (vLLM's CPU attention refuses 16). More
    ``num_layers`` make each decode step cost more while training stays dominated by the
    output layer over the vocabulary (the benchmarks' sampling-bound workload).
    """
    model = _random_llama(
        tokenizer,
        seed,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    vocab, eos = model.config.vocab_size, tokenizer.eos_token_id
    bias = math.log(eos_prob / (1 - eos_prob) * (vocab - 1))  # p = e^b / (e^b + vocab - 1)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = ENDING_LEVEL
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[eos] = 0.0
        model.lm_head.weight[eos, 0] = bias / math.sqrt(hidden_size)
    return model.eval()
