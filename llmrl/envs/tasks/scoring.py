"""Scoring a batch of replies with any task: built-in, a user's class, or reward functions.

:class:`TaskScorer` is the one way replies get their task reward (the env's
:class:`~llmrl.envs.transforms.task_reward.TaskReward`, so GRPO's env workers and the
evaluation alike). It gives each task the row's fields its ``score`` names, calls
``score_group`` once per GRPO group when the task has one, and contains the task's faults
(:mod:`llmrl.envs.tasks.user_calls`) when the task is the user's code. A
:class:`~llmrl.envs.tasks.reward_function.RewardFunctionTask` scores its own functions, each
contained on its own.

Example:
    >>> from llmrl.envs.tasks.arithmetic import ArithmeticTask
    >>> scorer = TaskScorer(ArithmeticTask())
    >>> [row.score.correct for row in scorer.score_rows(["#### 5", "#### 6"],
    ...                                                [{"answer": "5"}] * 2, [0, 0])]
    [True, False]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmrl.envs.tasks.reward_function import RowScore, accepted_fields, group_members, pick
from llmrl.envs.tasks.user_calls import GuardedCall


def is_user_code(task: Any) -> bool:
    """Whether ``task``'s class lives outside llmrl (its faults must be contained)."""
    return not type(task).__module__.startswith("llmrl.")


class TaskScorer:
    """Scores replies with ``task``; a user task's faults give ``fallback_reward`` (flagged),
    each call bounded by ``timeout_s`` (None: no deadline)."""

    def __init__(self, task: Any, fallback_reward: float = 0.0, timeout_s: float | None = None):
        self.task = task
        name = str(getattr(task, "name", type(task).__name__))
        self.guard = GuardedCall(name, fallback_reward, timeout_s if is_user_code(task) else None)
        self._group = getattr(task, "score_group", None)
        self._accepted = accepted_fields(self._group or task.score, skip=2)

    def score_rows(
        self, replies: Sequence[str], rows: Sequence[dict[str, Any]], groups: Sequence[int]
    ) -> list[RowScore]:
        """Each reply's score; ``rows[i]`` holds reply ``i``'s ``answer`` and fields."""
        own = getattr(self.task, "score_rows", None)
        if own is not None:
            return own(replies, rows, groups)
        if self._group is not None:
            outcomes: list[Any] = [None] * len(replies)
            for indices in group_members(groups).values():
                row = rows[indices[0]]
                found = self.guard.many(
                    self._group,
                    len(indices),
                    [replies[i] for i in indices],
                    str(row.get("answer", "")),
                    **pick(_fields(row), self._accepted),
                )
                for index, outcome in zip(indices, found, strict=True):
                    outcomes[index] = outcome
        else:
            outcomes = self.guard.each(
                [
                    (
                        self.task.score,
                        (reply, str(row.get("answer", ""))),
                        pick(_fields(row), self._accepted),
                    )
                    for reply, row in zip(replies, rows, strict=True)
                ]
            )
        return [RowScore(o.score, o.failed, {}) for o in outcomes]


def _fields(row: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in row.items() if name != "answer"}
