"""Fake policies and a fake tool for env and collector tests: a policy that replies with fixed
texts, one that asks for a given number of tool calls per prompt, and the tool that answers it."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from llmrl.data import ChatHistory, History
from llmrl.envs import DatasetChatEnv, EnvTransform


class ScriptedPolicy:
    """Answers row ``i`` with ``replies[i]`` (a string, or ``(text, is_complete)``), in the
    output layout of a history-mode policy: ``("history", "prompt" | "response" | "full")``."""

    def __init__(self, replies: list) -> None:
        self.replies = replies

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        prompt = td.get(("history", "prompt"))
        messages = []
        for reply in self.replies:
            text, complete = reply if isinstance(reply, tuple) else (reply, True)
            messages.append({"role": "assistant", "content": text, "is_complete": complete})
        out = td.clone(False)
        out.set("history", ChatHistory.from_histories(prompt, History.from_messages(messages)))
        return out


class CallingPolicy:
    """A fake history-mode policy: a row whose user message says ``calls=N`` replies 'CALL'
    until N tool calls were made, then 'done'. Counts its calls and rows."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        chats = td.get(("history", "prompt")).to_chats()
        self.calls.append(len(chats))
        messages = []
        for chat in chats:
            wanted = int(next(m for m in chat if m["role"] == "user")["content"].split("=")[1])
            made = sum(m["role"] == "assistant" for m in chat)
            text = "CALL" if made < wanted else "done"
            messages.append({"role": "assistant", "content": text, "is_complete": True})
        prompt = td.get(("history", "prompt"))
        out = td.clone(False)
        out.set("history", ChatHistory.from_histories(prompt, History.from_messages(messages)))
        return out


class FakeTool(EnvTransform):
    """Answers 'CALL' replies with a tool message, so the trajectory goes on."""

    is_tool = True

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        chats = td.get(("next", "history", "prompt")).to_chats()
        called = [chat[-1]["content"] == "CALL" for chat in chats]
        for chat, call in zip(chats, called, strict=True):
            if call:
                chat.append({"role": "tool", "content": "ok"})
        td.set(("next", "history", "prompt"), History.from_chats(chats))
        td.set("tool_called", td.get("tool_called") | torch.tensor(called))
        return td


# tool calls wanted per prompt, in dataset order: with max_turns=3 these trajectories last
# 1, 3, 2, 2 turns (two end on the same step) then 3 (truncated), 1, 1 (same step), 3.
CALLS = [0, 2, 1, 1, 5, 0, 0, 2]


def tool_env(epochs: int | None = None, transforms=()) -> DatasetChatEnv:
    """Eight prompts asking for :data:`CALLS` tool calls, 4 a batch, at most 3 turns, in order;
    :class:`FakeTool` first, then ``transforms``."""
    rows = [{"id": f"p{i}", "prompt": f"calls={n}", "answer": ""} for i, n in enumerate(CALLS)]
    return DatasetChatEnv(
        rows,
        batch_size=4,
        max_turns=3,
        shuffle=False,
        epochs=epochs,
        transforms=[FakeTool(), *transforms],
    )
