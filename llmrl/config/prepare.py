"""The ``prepare`` stage's config: which task, where its rows come from, how to split them.

Besides llmrl's own tasks, ``task`` may name the user's code (an import path or an installed
entry point: :mod:`llmrl.config.task_spec`), and ``reward`` one or several reward functions with
weights. Such a task reads a source in the user's shape (:mod:`llmrl.data.row_mapping`: the
prompt from a column, a ``prompt_template`` over several columns or a chat ``messages`` column;
every other column kept for the reward), or generates its problems when it has a ``generate``
method and no source is given.

Two kinds of built-in task exist. *Generated* tasks (arithmetic, countdown, ifeval) synthesize their
problems from a seed and read no data; *source* tasks (gsm8k, and ifeval when a ``source`` is
given) read rows from a local .jsonl/.json/.parquet file or a ``datasets`` ``save_to_disk``
directory. Nothing is downloaded: a hub id is read only from the local Hugging Face cache, and
one that is not cached is an error saying how to save a local copy (see
:mod:`llmrl.data.datasets`).
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from llmrl.config.task_spec import (
    REWARD_FUNCTIONS_TASK,
    RewardFunctionSpec,
    check_task_spec,
    reward_function_problems,
)
from llmrl.core.config_loading import MAX_ROWS, MAX_SEED, MAX_TEXT_CHARS, ConfigModel

LLMRL_TASKS: tuple[str, ...] = ("arithmetic", "gsm8k", "math", "countdown", "ifeval")
"""llmrl's own tasks, whose sources have the fixed fields below."""

USER_ROW_ROLES: tuple[str, ...] = ("prompt", "answer", "messages", "completion")
"""What ``columns`` may map for any other task: the prompt (text), the reference answer, a chat
``messages`` column (the prompt, and its last assistant turn as SFT target) and a completion
(the SFT target); every other column of a row is kept in ``Problem.fields``."""

GENERATED_TASKS: tuple[str, ...] = ("arithmetic", "countdown", "ifeval")
"""Tasks whose problems are synthesized from a seed (``generate`` section)."""

SOURCE_TASK_FIELDS: dict[str, tuple[str, ...]] = {
    "gsm8k": ("question", "answer"),
    "math": ("problem",),
    "ifeval": ("prompt", "instruction_id_list", "kwargs"),
}
"""Tasks that read rows from a ``source``, with the fields each row must provide (the first one is
the text that assigns a row to train or eval). A task in both this and :data:`GENERATED_TASKS`
reads a source when one is given and generates its problems otherwise."""

STRUCTURED_FIELDS: dict[str, tuple[str, ...]] = {"ifeval": ("instruction_id_list", "kwargs")}
"""Source fields that hold JSON values (lists, objects) rather than text; the task checks them."""

OPTIONAL_TASK_FIELDS: dict[str, tuple[str, ...]] = {"math": ("solution", "answer", "level", "type")}
"""Source fields a task reads when a row has them (null or absent: left out); the task checks
them (math needs a ``solution`` with a boxed answer, or an ``answer``)."""


class GenerateConfig(ConfigModel):
    """How many problems a generated task synthesizes, from which seed, with which options.

    Example::

        GenerateConfig(train_size=2000, eval_size=200, options={"digits": 3})
    """

    train_size: int = Field(
        2000, ge=1, le=MAX_ROWS, description="number of training problems to generate"
    )
    eval_size: int = Field(
        200, ge=0, le=MAX_ROWS, description="number of evaluation problems to generate"
    )
    seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description="seed of the generator; the same seed gives the same problems",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of the task's constructor, e.g. {digits: 3} for arithmetic",
    )


class SplitConfig(ConfigModel):
    """How rows of a source without an evaluation split are divided into train and eval.

    Each row goes to eval when a hash of its question text and ``seed`` falls under
    ``eval_fraction``: the assignment does not depend on row order, and duplicated questions
    always land in the same split.

    Example::

        SplitConfig(eval_fraction=0.1, seed=0)
    """

    eval_fraction: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="expected share of rows that go to the eval split (0 = no eval split)",
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="seed of the hash that assigns rows to splits"
    )


class PrepareConfig(ConfigModel):
    """Settings of ``llmrl prepare``: turn a task into ``train.jsonl`` / ``eval.jsonl``.

    The defaults describe a small generated arithmetic dataset that prepares in seconds on CPU.

    Example::

        PrepareConfig(task="gsm8k", source="data/gsm8k/train.jsonl", eval_source="data/test.jsonl")
    """

    task: str = Field(
        "arithmetic",
        description="the task to prepare: a built-in name (arithmetic, gsm8k, math, countdown, "
        "ifeval, reasoning-gym, verifiers, openenv), an import path of your own task class or "
        "reward function ('my_pkg.tasks:MyTask'), or a name your installed package registers "
        "in the entry-point group llmrl.tasks",
    )
    reward: list[RewardFunctionSpec] | None = Field(
        None,
        description="instead of `task`: your reward function(s), each {function: "
        "'my_pkg.rewards:score', weight, form, timeout_s, fallback_reward}; a bare import "
        "path string is one function of weight 1",
    )
    task_options: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of the task's constructor (your task class, an "
        "ecosystem adapter such as reasoning-gym's {dataset: ...}); recorded in the manifest, "
        "so every stage builds the same task",
    )
    instructions: str | None = Field(
        None,
        max_length=MAX_TEXT_CHARS,
        description="the system prompt of a `reward` task (the answer format your functions "
        "expect); null: a generic one",
    )
    prompt_template: str | None = Field(
        None,
        max_length=MAX_TEXT_CHARS,
        description="a task other than llmrl's own: the prompt as a template over the row's "
        "columns, e.g. 'Convert {value} {unit} to metres.' (write {{ and }} for braces)",
    )
    source: str | None = Field(
        None,
        description=(
            "where a source task's rows come from: a .jsonl/.json/.parquet file or a datasets "
            "save_to_disk directory; a hub id (owner/name) is read only from the local Hugging "
            "Face cache, never downloaded; null for generated tasks (ifeval: null generates, a "
            "source reads IFEval-format rows)"
        ),
    )
    subset: str | None = Field(
        None, description="configuration name of a hub dataset, e.g. 'main' for openai/gsm8k"
    )
    revision: str | None = Field(
        None,
        description=(
            "hub revision (branch, tag or commit) to read; pin it so a re-run reuses the same data"
        ),
    )
    source_split: str = Field(
        "train",
        description=(
            "split of a saved DatasetDict (or a cached hub dataset) to read training rows from; "
            "a folder holding a single Dataset has no splits and is read whole"
        ),
    )
    eval_split: str | None = Field(
        None,
        description=(
            "split of the eval source (or of `source` when eval_source is null) to read eval rows "
            "from, e.g. 'test'; only for saved datasets directories"
        ),
    )
    eval_source: str | None = Field(
        None,
        description=(
            "a separate source of eval rows (same formats as `source`); when it or eval_split "
            "is set, `split.eval_fraction` is not used"
        ),
    )
    reader: Literal["auto", "datasets"] = Field(
        "auto",
        description=(
            "how .jsonl/.json/.parquet files are read: 'auto' uses llmrl's own streaming readers; "
            "'datasets' loads them with the datasets library (offline, into an Arrow cache under "
            "cache_dir). A save_to_disk directory is always read with datasets"
        ),
    )
    cache_dir: Path | None = Field(
        None,
        description=(
            "where the datasets library keeps its Arrow cache for reader 'datasets' (null = "
            "<output_dir>/.datasets-cache); it does not change the prepared rows"
        ),
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "task field -> source column name, for sources whose columns are named differently, "
            "e.g. {question: problem_text, answer: solution}; unnamed fields use their own name"
        ),
    )
    generate: GenerateConfig = Field(
        default_factory=GenerateConfig, description="sizes, seed and options of a generated task"
    )
    split: SplitConfig = Field(
        default_factory=SplitConfig,
        description="train/eval split of a source that has no separate eval rows",
    )
    on_invalid: Literal["error", "skip"] = Field(
        "error",
        description=(
            "what an invalid source row does: 'error' stops naming file, row and field; 'skip' "
            "drops it and counts it per reason in the manifest"
        ),
    )
    max_rows: int | None = Field(
        None,
        ge=1,
        le=MAX_ROWS,
        description="read at most this many rows from each source (null = all)",
    )
    max_row_chars: int = Field(
        100_000,
        ge=1,
        le=MAX_TEXT_CHARS,
        description="a row field longer than this many characters is invalid",
    )
    output_dir: Path = Field(
        Path("data/prepared"),
        description=(
            "where prepared datasets go, each in <output_dir>/<task>-<digest>; relative paths "
            "are relative to the working directory"
        ),
    )

    @field_validator("source", "eval_source", "subset", "revision", "eval_split", "source_split")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty; use null to leave it unset")
        return value

    @field_validator("reward", mode="before")
    @classmethod
    def _reward_list(cls, value: Any) -> Any:
        if isinstance(value, (str, dict)):
            value = [value]
        if isinstance(value, list):
            return [{"function": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("task")
    @classmethod
    def _task_loads(cls, value: str) -> str:
        return check_task_spec(value)

    @field_validator("prompt_template")
    @classmethod
    def _template_parses(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(value) if name]
        except ValueError as error:
            raise ValueError(f"not a template ({error}); write {{{{ and }}}} for braces") from None
        if not names:
            raise ValueError("names no column: use {column} for a row's value")
        bad = [name for name in names if not re.fullmatch(r"\w+", name)]
        if bad:
            raise ValueError(f"placeholders must be plain column names, got {bad}")
        return value

    @field_validator("columns")
    @classmethod
    def _columns_named(cls, value: dict[str, str]) -> dict[str, str]:
        for field, column in value.items():
            if not column.strip():
                raise ValueError(f"the column for task field '{field}' must not be empty")
        return value

    @model_validator(mode="before")
    @classmethod
    def _reward_is_the_task(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("reward") is not None:
            if data.get("task", REWARD_FUNCTIONS_TASK) != REWARD_FUNCTIONS_TASK:
                raise ValueError("task: set `task` or `reward`, not both")
            data = {**data, "task": REWARD_FUNCTIONS_TASK}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> PrepareConfig:
        if self.reward is not None:
            problems = reward_function_problems(self.reward, "reward")
            if problems:
                raise ValueError("\n".join(problems))
        elif self.task == REWARD_FUNCTIONS_TASK:
            raise ValueError(f"reward: required for task '{REWARD_FUNCTIONS_TASK}'")
        if not self.is_llmrl_task:
            problems = self._user_task_problems()
        elif self.is_generated:
            problems = self._generated_problems()
        else:
            problems = self._source_problems(
                SOURCE_TASK_FIELDS[self.task] + OPTIONAL_TASK_FIELDS.get(self.task, ())
            )
        for name in ("prompt_template", "instructions"):
            if self.is_llmrl_task and getattr(self, name) is not None:
                problems.append(f"{name}: only for your own tasks; task '{self.task}' sets it")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def is_llmrl_task(self) -> bool:
        """Whether the task is one of llmrl's own (fixed source fields, no user columns)."""
        return self.task in LLMRL_TASKS

    def task_build_options(self) -> dict[str, Any]:
        """The options :func:`~llmrl.envs.tasks.make_task` builds this task with (recorded in
        the manifest)."""
        options = dict(self.task_options)
        if self.reward is not None:
            options["functions"] = [
                {"function": spec.function, **spec.options()} for spec in self.reward
            ]
            if self.instructions is not None:
                options["instructions"] = self.instructions
        return options

    def _user_task_problems(self) -> list[str]:
        problems = []
        for name in self.columns:
            if name not in USER_ROW_ROLES:
                problems.append(
                    f"columns.{name}: not a role a column can take ({', '.join(USER_ROW_ROLES)}); "
                    "every other column is kept for the reward under its own name"
                )
        if self.prompt_template is not None and "messages" in self.columns:
            problems.append("prompt_template: set it or columns.messages, not both")
        if self.source is None and self.eval_source is not None:
            problems.append("eval_source: needs a `source` for the training rows")
        if self.source is not None and self.generate != GenerateConfig():
            problems.append(f"generate: task '{self.task}' reads `source`; remove one of them")
        return problems

    @property
    def is_generated(self) -> bool:
        """Whether the task synthesizes its problems (no source is read)."""
        if not self.is_llmrl_task:
            return self.source is None
        if self.task not in GENERATED_TASKS:
            return False
        return self.task not in SOURCE_TASK_FIELDS or (
            self.source is None and self.eval_source is None
        )

    def _generated_problems(self) -> list[str]:
        reason = f"task '{self.task}' is generated and reads no source; remove it"
        problems = [
            f"{name}: {reason}"
            for name in ("source", "eval_source", "subset", "revision", "eval_split", "max_rows")
            if getattr(self, name) is not None
        ]
        if self.reader != "auto" or self.cache_dir is not None:
            problems.append(f"reader/cache_dir: {reason}")
        if self.columns:
            problems.append(f"columns: {reason}")
        if self.split != SplitConfig():
            problems.append(f"split: {reason} (its eval set comes from generate.eval_size)")
        return problems

    def _source_problems(self, fields: tuple[str, ...]) -> list[str]:
        problems = []
        if self.source is None:
            problems.append(
                f"source: required for task '{self.task}': a .jsonl/.json/.parquet file, a "
                "datasets save_to_disk directory, or a cached hub id such as openai/gsm8k"
            )
        if self.generate != GenerateConfig():
            generated = ", ".join(GENERATED_TASKS)
            problems.append(
                f"generate: only for generated tasks ({generated}) without a source; task "
                f"'{self.task}' reads `source`"
            )
        for name in self.columns:
            if name not in fields:
                problems.append(
                    f"columns.{name}: not a field of task '{self.task}' "
                    f"(fields: {', '.join(fields)})"
                )
        has_eval_rows = self.eval_source is not None or self.eval_split is not None
        if has_eval_rows and self.split.eval_fraction != SplitConfig().eval_fraction:
            problems.append(
                "split.eval_fraction: not used when eval_source or eval_split is set; remove it"
            )
        return problems
