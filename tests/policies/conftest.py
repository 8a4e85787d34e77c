"""Fixtures for policy tests: a tiny model that often ends its responses with EOS (the shared
prompts are in :mod:`tests.support.chats`)."""

from __future__ import annotations

import pytest
import torch

from llmrl.models import tiny_model


@pytest.fixture(scope="session")
def eos_model(tokenizer):
    """Tiny random Llama whose output layer favours EOS (~6% a step): ragged responses,
    most of them ending with EOS (which is also the pad token)."""
    model = tiny_model(tokenizer, seed=1)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 8.0
    model.lm_head = head
    return model.eval()
