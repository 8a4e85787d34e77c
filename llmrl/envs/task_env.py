"""Task environments: a dataset of problems, the task's instructions as system prompt, and the
task's verifiable reward on every reply.

``ArithmeticEnv``, ``CountdownEnv`` and ``IFEvalEnv`` generate their problems (deterministic
from ``seed``); ``GSM8KEnv`` reads GSM8K rows (a JSONL path or a list of problems).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmrl.envs.dataset_env import DatasetChatEnv
from llmrl.envs.tasks import ArithmeticTask, CountdownTask, GSM8KTask, IFEvalTask
from llmrl.envs.tasks.base import Problem, Task
from llmrl.envs.tasks.gsm8k import load_problems
from llmrl.envs.transforms.base import EnvTransform
from llmrl.envs.transforms.task_reward import TaskReward


class TaskEnv(DatasetChatEnv):
    """A :class:`DatasetChatEnv` over ``problems`` scored by ``task``.

    The system prompt defaults to ``task.instructions`` (the required answer format). Extra
    ``transforms`` (tools, KL penalty, ...) run before the task's reward.

    Example:
        >>> task = ArithmeticTask(digits=2)
        >>> env = TaskEnv(task, task.generate(100, seed=0), batch_size=4, repeats=8)
    """

    def __init__(
        self,
        task: Task,
        problems: Sequence[Problem],
        batch_size: int,
        repeats: int = 1,
        system_prompt: str | None = None,
        transforms: list[EnvTransform] | None = None,
        **env_options: Any,
    ) -> None:
        super().__init__(
            problems,
            batch_size,
            repeats,
            system_prompt=task.instructions if system_prompt is None else system_prompt,
            transforms=[*(transforms or []), TaskReward(task)],
            **env_options,
        )
        self.task = task
        self.problems = list(problems)


def _generated(
    task: ArithmeticTask | CountdownTask | IFEvalTask,
    num_problems: int,
    seed: int,
    split: str,
    batch_size: int,
    repeats: int,
    env_options: dict[str, Any],
) -> dict[str, Any]:
    return {
        "task": task,
        "problems": task.generate(num_problems, seed=seed, split=split),
        "batch_size": batch_size,
        "repeats": repeats,
        "seed": seed,
        **env_options,
    }


class ArithmeticEnv(TaskEnv):
    """Generated integer arithmetic; the default task of ``make run`` (no download needed).
    Difficulty: ``num_operands``, ``digits``, ``operators``."""

    def __init__(
        self,
        batch_size: int,
        repeats: int = 1,
        num_problems: int = 1000,
        seed: int = 0,
        split: str = "train",
        num_operands: int = 2,
        digits: int = 2,
        operators: str = "+-*",
        format_reward: float = 0.1,
        **env_options: Any,
    ) -> None:
        task = ArithmeticTask(num_operands, digits, operators, format_reward)
        super().__init__(
            **_generated(task, num_problems, seed, split, batch_size, repeats, env_options)
        )


class CountdownEnv(TaskEnv):
    """Reach a target number with given numbers and + - * /; verified without ``eval``."""

    def __init__(
        self,
        batch_size: int,
        repeats: int = 1,
        num_problems: int = 1000,
        seed: int = 0,
        split: str = "train",
        task_options: dict[str, Any] | None = None,
        **env_options: Any,
    ) -> None:
        task = CountdownTask(**(task_options or {}))
        super().__init__(
            **_generated(task, num_problems, seed, split, batch_size, repeats, env_options)
        )


class IFEvalEnv(TaskEnv):
    """Instruction following with checkable constraints (word counts, keywords, JSON, ...)."""

    def __init__(
        self,
        batch_size: int,
        repeats: int = 1,
        num_problems: int = 1000,
        seed: int = 0,
        split: str = "train",
        task_options: dict[str, Any] | None = None,
        **env_options: Any,
    ) -> None:
        task = IFEvalTask(**(task_options or {}))
        super().__init__(
            **_generated(task, num_problems, seed, split, batch_size, repeats, env_options)
        )


class GSM8KEnv(TaskEnv):
    """Grade-school math word problems, reward by exact match of the final number.

    ``source`` is a GSM8K JSONL file (fields ``question``, ``answer``) or a list of problems
    (e.g. from a prepared dataset).
    """

    def __init__(
        self,
        source: str | Path | Sequence[Problem],
        batch_size: int,
        repeats: int = 1,
        split: str = "train",
        limit: int | None = None,
        format_reward: float = 0.0,
        **env_options: Any,
    ) -> None:
        if isinstance(source, (str, Path)):
            problems = load_problems(source, split, limit=limit)
        else:
            problems = list(source)[:limit]
        super().__init__(GSM8KTask(format_reward), problems, batch_size, repeats, **env_options)
