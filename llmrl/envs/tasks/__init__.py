"""Tasks: problem generators and verifiable rewards, one task per module.

``make_task(spec, **options)`` builds a task as configs name it: a built-in name, an import path
of the user's code (a task class or a reward function) or an installed package's entry point
(:mod:`llmrl.config.task_spec`). Every stage resolves a task this way.
"""

from __future__ import annotations

from typing import Any

from llmrl.config.task_spec import BUILTIN_TASKS, REWARD_FUNCTIONS_TASK
from llmrl.core.user_code import UserCodeError, load_object
from llmrl.data.problem import Problem
from llmrl.envs.tasks.arithmetic import ArithmeticTask
from llmrl.envs.tasks.base import Score, Task
from llmrl.envs.tasks.countdown import CountdownTask
from llmrl.envs.tasks.gsm8k import GSM8KTask
from llmrl.envs.tasks.ifeval import IFEvalTask
from llmrl.envs.tasks.math import MathTask
from llmrl.envs.tasks.reward_function import (
    RewardFunction,
    RewardFunctionTask,
    batch_reward,
    group_reward,
)

TASKS: dict[str, type] = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "gsm8k": GSM8KTask,
    "ifeval": IFEvalTask,
    "math": MathTask,
}
"""llmrl's own tasks (the ecosystem adapters, imported when used, are in ``BUILTIN_TASKS``)."""

_REWARD_OPTIONS = ("weight", "name", "form", "timeout_s", "fallback_reward", "correct_at")


def make_task(spec: str, **options: Any) -> Task:
    """The task ``spec`` names, built with ``options``.

    ``spec``: a built-in name (``arithmetic``, ``reasoning-gym``, ...), ``reward-functions``
    (``options["functions"]``: a list of ``{function, weight, ...}``, and ``instructions``),
    an import path (``pkg.module:Name``) or an entry point of group ``llmrl.tasks``. What it
    names may be a task class (called with ``options``), a task object, or a plain reward
    function (``options``: its weight, form, timeout_s, fallback_reward, correct_at, name and
    the task's ``instructions``).

    Raises:
        ValueError: an unknown name, user code that does not import (naming the import
            error), an object that is not a task, or options its constructor refuses.

    Example:
        >>> make_task("arithmetic", digits=3).name
        'arithmetic'
        >>> make_task("json:loads").name
        'loads'
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"task: expected a task name or import path, got {spec!r}")
    if spec == REWARD_FUNCTIONS_TASK:
        return reward_functions_task(**options)
    if spec in TASKS:
        return TASKS[spec](**options)
    target = BUILTIN_TASKS.get(spec, spec)
    try:
        found = load_object(target, field="task")
    except UserCodeError as error:
        if spec not in BUILTIN_TASKS:
            known = ", ".join(sorted(BUILTIN_TASKS))
            raise UserCodeError("task", f"{error.detail} (built-in tasks: {known})") from None
        raise UserCodeError(
            "task",
            f"{spec!r} needs an optional dependency: {error.detail} (pip install "
            "'llmrl[ecosystem]')",
        ) from None
    return _as_task(found, spec, options)


def reward_functions_task(
    functions: list[dict[str, Any]], instructions: str | None = None, name: str | None = None
) -> RewardFunctionTask:
    """A task of weighted reward functions, each ``{function: <import path>, weight, ...}``."""
    built = []
    for index, item in enumerate(functions):
        item = dict(item)
        spec = item.pop("function", None)
        if not isinstance(spec, str):
            raise ValueError(f"functions[{index}]: needs 'function', an import path")
        function = load_object(spec, field=f"reward[{index}].function")
        built.append(RewardFunction(function, **item))
    extra = {"instructions": instructions} if instructions else {}
    return RewardFunctionTask(built, name=name, **extra)


def _as_task(found: Any, spec: str, options: dict[str, Any]) -> Task:
    if isinstance(found, type):
        try:
            task = found(**options)
        except TypeError as error:
            raise ValueError(f"task {spec!r}: {error}") from None
    elif callable(found) and not hasattr(found, "score"):  # a plain reward function
        unknown = sorted(set(options) - {*_REWARD_OPTIONS, "instructions"})
        if unknown:
            raise ValueError(
                f"task {spec!r} is a reward function; options {unknown} are not its settings "
                f"(known: {', '.join(_REWARD_OPTIONS)}, instructions)"
            )
        instructions = options.pop("instructions", None)
        extra = {"instructions": instructions} if instructions else {}
        return RewardFunctionTask([RewardFunction(found, **options)], **extra)
    elif options:
        raise ValueError(f"task {spec!r} is an object, not a class: it takes no options")
    else:
        task = found
    missing = [name for name in ("name", "instructions", "score") if not hasattr(task, name)]
    if missing:
        raise ValueError(
            f"task {spec!r} ({type(task).__name__}) lacks {', '.join(missing)}: a task needs a "
            "name, instructions (its system prompt) and score(response, answer, **fields)"
        )
    return task


__all__ = [
    "TASKS",
    "ArithmeticTask",
    "CountdownTask",
    "GSM8KTask",
    "IFEvalTask",
    "MathTask",
    "Problem",
    "RewardFunction",
    "RewardFunctionTask",
    "Score",
    "Task",
    "batch_reward",
    "group_reward",
    "make_task",
]
