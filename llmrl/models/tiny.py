"""Tiny random Llama models that share SmolLM2's real tokenizer, for fast tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()
