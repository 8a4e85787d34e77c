"""Env test helpers: a scripted chat policy that answers with fixed replies."""

from __future__ import annotations

from tensordict import TensorDictBase

from llmrl.data import ChatHistory, History


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
