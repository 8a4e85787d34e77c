"""Fixtures for policy tests: a tiny model that often ends its responses with EOS."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl.data import ChatHistory, History
from llmrl.models import tiny_model

PROMPTS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a colour."}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about ünïcödé 🚀"},
    ],
]


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


def history_batch(prompts=PROMPTS) -> TensorDict:
    """A batch ``[B]`` with ``("history", "prompt")`` and a row id."""
    history = History.from_chats(prompts)
    return TensorDict(
        {
            "history": ChatHistory(prompt=history, batch_size=[len(prompts)]),
            "row_id": torch.arange(len(prompts)),
        },
        batch_size=[len(prompts)],
    )
