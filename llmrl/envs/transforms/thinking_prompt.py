"""`AddThinkingPrompt`: asks the model to reason before it answers."""

from __future__ import annotations

from tensordict import TensorDictBase

from llmrl.data import History
from llmrl.envs.transforms.base import EnvTransform

DEFAULT_INSTRUCTION = (
    "Think through the problem step by step inside <think> </think> tags, "
    "then give the final answer."
)


class AddThinkingPrompt(EnvTransform):
    """Adds a reasoning-format instruction to the system prompt of every conversation at reset
    (creating a system message when there is none)."""

    def __init__(
        self, instruction: str = DEFAULT_INSTRUCTION, history_key: str = "history"
    ) -> None:
        self.instruction = instruction
        self.history_key = history_key

    def on_reset(self, td: TensorDictBase) -> TensorDictBase:
        key = (self.history_key, "prompt")
        chats = td.get(key).to_chats()
        for chat in chats:
            if chat[0]["role"] == "system":
                chat[0]["content"] = f"{chat[0]['content']}\n\n{self.instruction}"
            else:
                chat.insert(0, {"role": "system", "content": self.instruction})
        td.set(key, History.from_chats(chats))
        return td

    def __repr__(self) -> str:
        return f"AddThinkingPrompt({self.instruction[:30]!r}...)"
