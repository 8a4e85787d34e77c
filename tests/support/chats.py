"""Chat prompts as a policy's input: a few conversations (multi-turn, a system prompt,
non-ASCII text) and the batch a collector would hand a history-mode policy."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from llmrl.data import ChatHistory, History

PROMPTS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a colour."}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about ünïcödé 🚀"},
    ],
]


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
