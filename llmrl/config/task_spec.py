"""How a config names a task or a reward: the built-in names, import paths and entry points.

One resolution serves every stage (prepare, SFT data, GRPO env workers, eval; the object is
built by :func:`llmrl.envs.tasks.make_task`): a ``task`` is

- a built-in name (:data:`BUILTIN_TASKS`: llmrl's tasks and the ecosystem adapters);
- an import path, ``my_pkg.tasks:MyTask`` (a class with the task interface, called with the
  config's ``task_options``) or ``my_pkg.rewards:score`` (a plain reward function);
- the name an installed package registers in the entry-point group ``llmrl.tasks``.

A ``reward`` (:class:`RewardFunctionSpec`) names a reward function the same way, with its weight,
form and fault settings. Names that do not import are refused when the config is validated,
naming the field and the import error, before anything starts.

Example:
    >>> RewardFunctionSpec(function="json:loads", weight=0.5).metric_name
    'loads'
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from llmrl.core.config_loading import MAX_TIMEOUT_S, ConfigModel
from llmrl.core.user_code import (
    UserCodeError,
    entry_point_names,
    find_entry_point,
    is_import_path,
    load_object,
)

BUILTIN_TASKS: dict[str, str] = {
    "arithmetic": "llmrl.envs.tasks.arithmetic:ArithmeticTask",
    "countdown": "llmrl.envs.tasks.countdown:CountdownTask",
    "gsm8k": "llmrl.envs.tasks.gsm8k:GSM8KTask",
    "ifeval": "llmrl.envs.tasks.ifeval:IFEvalTask",
    "math": "llmrl.envs.tasks.math:MathTask",
    "reward-functions": "llmrl.envs.tasks.reward_function:RewardFunctionTask",
    "reasoning-gym": "llmrl.envs.ecosystem.reasoning_gym:ReasoningGymTask",
    "verifiers": "llmrl.envs.ecosystem.verifiers_env:VerifiersTask",
    "openenv": "llmrl.envs.ecosystem.openenv_env:OpenEnvTask",
}
"""Built-in task names and the class each names (imported only when used)."""

REWARD_FUNCTIONS_TASK = "reward-functions"
"""The task a prepare config's ``reward:`` builds: its functions, weighted."""

MAX_REWARD_WEIGHT = 1e6

RESERVED_METRIC_NAMES = ("task", "reward_model", "judge", "reward", "shaping", "audit")
"""Names a reward function may not take: its metrics would mix with these."""


def check_task_spec(spec: str) -> str:
    """``spec`` when it names a task that can be loaded; raises ``ValueError`` with the cause
    otherwise (user code is imported to check it; the validator's error names the field)."""
    if spec in BUILTIN_TASKS:
        return spec
    if not is_import_path(spec) and find_entry_point(spec) is None:
        raise ValueError(
            f"{spec!r} is not a built-in task ({', '.join(BUILTIN_TASKS)}), an import path "
            "('package.module:Name') or an entry point of group 'llmrl.tasks' (installed: "
            f"{', '.join(entry_point_names()) or 'none'})"
        )
    try:
        load_object(spec, field="task")
    except UserCodeError as error:
        raise ValueError(error.detail) from None
    return spec


class RewardFunctionSpec(ConfigModel):
    """A reward function from the user's code, with its weight and how its faults are handled.

    Example (YAML)::

        reward:
          - {function: my_pkg.rewards:exact, weight: 1.0}
          - {function: my_pkg.rewards:brevity, weight: 0.1, form: group, timeout_s: 5}
    """

    function: str = Field(
        description="the function: an import path 'package.module:name' or an entry point of "
        "group llmrl.tasks; it gets the reply and the row's fields (answer, prompt and every "
        "column of the dataset) and returns a number or a Score"
    )
    weight: float = Field(
        1.0,
        ge=-MAX_REWARD_WEIGHT,
        le=MAX_REWARD_WEIGHT,
        description="its weight in the row's reward",
    )
    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z][A-Za-z0-9_]*$",
        description="the name of its metrics (<name>/score_mean, <name>/failures); default: "
        "the function's own name",
    )
    form: Literal["single", "batch", "group"] | None = Field(
        None,
        description="single: once per reply; batch: once per env worker batch, fields as "
        "lists; group: once per GRPO group; null: as the function's @batch_reward / "
        "@group_reward decorator says, else single",
    )
    timeout_s: float = Field(
        30.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="seconds one call may take; a call past it gives its rows the fallback",
    )
    fallback_reward: float = Field(
        0.0,
        ge=-MAX_REWARD_WEIGHT,
        le=MAX_REWARD_WEIGHT,
        description="the reward of a row whose call raised, timed out or returned NaN or a "
        "wrong type (flagged, counted in <name>/failures)",
    )
    correct_at: float = Field(
        1.0, description="a plain number at least this counts as a correct answer (accuracy)"
    )

    @field_validator("function")
    @classmethod
    def _loads(cls, spec: str) -> str:
        try:
            found = load_object(spec, field="function")
        except UserCodeError as error:
            raise ValueError(error.detail) from None
        if not callable(found) or isinstance(found, type):
            raise ValueError(f"{spec!r} is not a function (got {type(found).__name__})")
        return spec

    @property
    def metric_name(self) -> str:
        """The name its metrics and columns use."""
        return self.name or self.function.rsplit(":", 1)[-1].rsplit(".", 1)[-1]

    def options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~llmrl.envs.tasks.reward_function.RewardFunction`
        (without the function itself)."""
        return {
            "weight": self.weight,
            "name": self.metric_name,
            "form": self.form,
            "timeout_s": self.timeout_s,
            "fallback_reward": self.fallback_reward,
            "correct_at": self.correct_at,
        }


def reward_function_problems(specs: list[RewardFunctionSpec], field: str) -> list[str]:
    """Names used twice or reserved, as ``<field>: ...`` problems."""
    problems, seen = [], set()
    for index, spec in enumerate(specs):
        name = spec.metric_name
        if name in seen:
            problems.append(f"{field}[{index}].name: {name!r} is used twice; set name")
        if name in RESERVED_METRIC_NAMES:
            problems.append(
                f"{field}[{index}].name: {name!r} is reserved ({', '.join(RESERVED_METRIC_NAMES)})"
            )
        seen.add(name)
    return problems
