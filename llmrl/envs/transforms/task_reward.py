"""`TaskReward`: scores each reply with a task's verifiable reward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tensordict import TensorDictBase

from llmrl.data.non_tensor import as_list
from llmrl.envs.transforms.base import EnvTransform

if TYPE_CHECKING:
    from llmrl.envs.tasks.base import Task


class TaskReward(EnvTransform):
    """Adds ``weight * task.score(reply, answer).reward`` to ``reward`` and records ``correct``
    and ``formatted`` (bool ``[B]``, whatever the weight). The reply is the last assistant
    message of ``("history", "full")``; the reference is the row's ``answer``."""

    def __init__(
        self,
        task: Task,
        answer_key: str = "answer",
        history_key: str = "history",
        weight: float = 1.0,
    ) -> None:
        self.task = task
        self.answer_key = answer_key
        self.history_key = history_key
        self.weight = weight

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        answers = [str(a) for a in as_list(td.get(self.answer_key))]
        replies = [
            next((m["content"] for m in reversed(chat) if m["role"] == "assistant"), "")
            for chat in td.get((self.history_key, "full")).to_chats()
        ]
        scores = [self.task.score(r, a) for r, a in zip(replies, answers, strict=True)]
        rewards = torch.tensor([s.reward for s in scores])
        td.set(
            "reward", td.get("reward") + (rewards if self.weight == 1 else self.weight * rewards)
        )
        td.set("correct", torch.tensor([s.correct for s in scores]))
        td.set("formatted", torch.tensor([s.formatted for s in scores]))
        return td

    def __repr__(self) -> str:
        return f"TaskReward({getattr(self.task, 'name', type(self.task).__name__)})"
