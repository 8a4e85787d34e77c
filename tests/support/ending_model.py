"""A tiny Llama folder whose replies end with EOS at a set rate: ragged, skewed lengths from any
engine that loads a Hugging Face folder (transformers, vLLM's CPU build).

How the rate is set: every token's embedding holds a constant ``LEVEL`` in dimension 0, which
dominates the residual stream, so the final RMSNorm's output holds about ``sqrt(hidden)`` there
and little elsewhere: every logit but EOS's is then close to 0 (a near-uniform draw over the
vocabulary), and EOS's, ``lm_head[eos, 0] * sqrt(hidden)``, is set so that EOS has probability
``eos_prob`` at each step. Lengths are then geometric, cut at the budget: most short, a few at
the budget (``(1 - eos_prob) ** budget`` of them).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

LEVEL = 30.0
"""Dimension 0 of every embedding (the other dimensions are initialised at std 0.02)."""


def ending_model(tokenizer, eos_prob: float, seed: int = 0, hidden_size: int = 64):
    """The model (untied embeddings, eval mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 32: vLLM's CPU attention refuses 16
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    vocab, eos = config.vocab_size, tokenizer.eos_token_id
    # EOS against vocab - 1 logits near 0: p = e^b / (e^b + vocab - 1)
    bias = math.log(eos_prob / (1 - eos_prob) * (vocab - 1))
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = LEVEL
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[eos] = 0.0
        model.lm_head.weight[eos, 0] = bias / math.sqrt(hidden_size)
    return model.eval()


def save_ending_model(folder: Path, tokenizer, eos_prob: float, seed: int = 0) -> Path:
    """:func:`ending_model` saved with ``tokenizer`` in ``folder`` (a ``model.name``)."""
    ending_model(tokenizer, eos_prob, seed=seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
