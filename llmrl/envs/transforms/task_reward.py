"""`TaskReward`: scores each reply with a task's reward (built-in, the user's class or functions).

The reply is the last assistant message of ``("history", "full")``; the row's ``answer``,
``query`` (as ``prompt``) and ``fields`` (the user's columns) reach the task as its fields
(:class:`~llmrl.envs.tasks.scoring.TaskScorer`). Writes, besides adding ``weight * reward`` to
``reward``: ``correct`` and ``formatted`` (bool ``[B]``, whatever the weight), ``task_failed``
(bool ``[B]``: the user's code failed on the row, which got the fallback reward) and, for a
task made of several reward functions, ``<function>_score`` / ``<function>_failed`` per function,
which the step reports as ``<function>/score_mean`` and ``<function>/failures``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from llmrl.data.non_tensor import as_list
from llmrl.envs.tasks.scoring import TaskScorer
from llmrl.envs.transforms.base import EnvTransform

if TYPE_CHECKING:
    from llmrl.envs.tasks.base import Task


def last_replies(td: TensorDictBase, history_key: str = "history") -> list[str]:
    """The last assistant message of each row's ``(history_key, "full")`` conversation."""
    return [
        next((m["content"] for m in reversed(chat) if m["role"] == "assistant"), "")
        for chat in td.get((history_key, "full")).to_chats()
    ]


def row_fields(td: TensorDictBase, answer_key: str = "answer") -> list[dict[str, Any]]:
    """Each row's fields as a reward sees them: ``answer``, ``prompt`` (the ``query``) and the
    row's ``fields`` (the user's dataset columns; they win over the two names)."""
    size = td.batch_size[0]
    answers = [str(a) for a in as_list(td.get(answer_key))]
    queries = as_list(td.get("query")) if "query" in td.keys() else [None] * size  # noqa: SIM118
    extra = as_list(td.get("fields")) if "fields" in td.keys() else [None] * size  # noqa: SIM118
    return [
        {"answer": a, "prompt": q, **(f or {})}
        for a, q, f in zip(answers, queries, extra, strict=True)
    ]


def group_ids(td: TensorDictBase) -> list[int]:
    """Each row's GRPO group (every row its own when the batch has no ``group_id``)."""
    if "group_id" in td.keys():  # noqa: SIM118
        return [int(g) for g in td.get("group_id").reshape(-1).tolist()]
    return list(range(td.batch_size[0]))


class TaskReward(EnvTransform):
    """Adds ``weight * task reward`` to ``reward`` (see the module docstring).

    ``fallback_reward`` and ``timeout_s`` apply to a task from the user's code: a row whose
    score raised, overstayed ``timeout_s``, or was not a finite number gets the fallback.
    """

    def __init__(
        self,
        task: Task,
        answer_key: str = "answer",
        history_key: str = "history",
        weight: float = 1.0,
        fallback_reward: float = 0.0,
        timeout_s: float | None = None,
    ) -> None:
        self.task = task
        self.answer_key = answer_key
        self.history_key = history_key
        self.weight = weight
        self.scorer = TaskScorer(task, fallback_reward, timeout_s)

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        scores = self.scorer.score_rows(
            last_replies(td, self.history_key), row_fields(td, self.answer_key), group_ids(td)
        )
        rewards = torch.tensor([s.score.reward for s in scores], dtype=torch.float32)
        td.set(
            "reward", td.get("reward") + (rewards if self.weight == 1 else self.weight * rewards)
        )
        td.set("correct", torch.tensor([s.score.correct for s in scores], dtype=torch.bool))
        td.set("formatted", torch.tensor([s.score.formatted for s in scores], dtype=torch.bool))
        td.set("task_failed", torch.tensor([s.failed for s in scores], dtype=torch.bool))
        for name in scores[0].parts if scores else ():
            parts = [s.parts[name] for s in scores]
            td.set(f"{name}_score", torch.tensor([p.reward for p in parts], dtype=torch.float32))
            td.set(f"{name}_failed", torch.tensor([p.failed for p in parts], dtype=torch.bool))
        return td

    def __repr__(self) -> str:
        return f"TaskReward({getattr(self.task, 'name', type(self.task).__name__)})"
