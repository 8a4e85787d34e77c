"""Tasks: problem generators and verifiable rewards, one task per module.

``make_task(name, **options)`` builds a task from its name, as configs refer to them.
"""

from __future__ import annotations

from typing import Any

from llmrl.data.problem import Problem
from llmrl.envs.tasks.arithmetic import ArithmeticTask
from llmrl.envs.tasks.base import Score, Task
from llmrl.envs.tasks.countdown import CountdownTask
from llmrl.envs.tasks.gsm8k import GSM8KTask
from llmrl.envs.tasks.ifeval import IFEvalTask
from llmrl.envs.tasks.math import MathTask

TASKS: dict[str, type] = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "gsm8k": GSM8KTask,
    "ifeval": IFEvalTask,
    "math": MathTask,
}


def make_task(name: str, **options: Any) -> Task:
    """The task called ``name`` with its constructor ``options``."""
    try:
        cls = TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}") from None
    return cls(**options)


__all__ = [
    "TASKS",
    "ArithmeticTask",
    "CountdownTask",
    "GSM8KTask",
    "IFEvalTask",
    "MathTask",
    "Problem",
    "Score",
    "Task",
    "make_task",
]
