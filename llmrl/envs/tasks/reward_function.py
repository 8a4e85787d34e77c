"""Plain reward functions from the user's code, alone or several with weights, as a task.

A reward function takes the reply and the row's fields and returns a number or a
:class:`~llmrl.envs.tasks.base.Score`. The fields are every column of the user's prepared
dataset (``Problem.fields``) plus ``answer`` and ``prompt``; a function gets those its
signature names, or all of them when it takes ``**fields``. Three forms:

- ``single`` (the default): ``score(response, **fields) -> float | Score``, once per reply;
- ``batch``: ``score(responses, **columns) -> list``, once per batch of an env worker, each
  field a list with one value per reply (TRL's ``reward_funcs`` convention);
- ``group``: ``score(responses, **fields) -> list``, once per GRPO group: the G replies to one
  prompt, with that prompt's fields (rank-based or pairwise rewards).

Mark a form with :func:`batch_reward` or :func:`group_reward` (or ``form:`` in the config). An
``async def`` function is awaited, the calls of one batch concurrently (a function that calls a
service). Every call is contained (:mod:`llmrl.envs.tasks.user_calls`): an exception, a call
past ``timeout_s``, NaN or a wrong type gives the row ``fallback_reward`` and flags it.

Example (hand-computed: 0.5 * 1 + 2 * 0.25):
    >>> def exact(response, answer):
    ...     return float(response.strip() == answer)
    >>> def short(response):
    ...     return Score(0.25, correct=False)
    >>> task = RewardFunctionTask([RewardFunction(exact, weight=0.5), RewardFunction(short, 2.0)])
    >>> [row.score.reward for row in task.score_rows(["4"], [{"answer": "4"}], [0])]
    [1.0]
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llmrl.envs.tasks.base import Score
from llmrl.envs.tasks.user_calls import GuardedCall, Outcome

Form = Literal["single", "batch", "group"]
FORMS: tuple[str, ...] = ("single", "batch", "group")
_FORM_ATTRIBUTE = "llmrl_reward_form"

DEFAULT_INSTRUCTIONS = "Answer the user's request."
"""The system prompt of a reward-function task that sets no ``instructions``."""


def batch_reward(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``function`` as a batch reward: ``function(responses, **columns) -> list``."""
    setattr(function, _FORM_ATTRIBUTE, "batch")
    return function


def group_reward(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``function`` as a group reward: all G replies of one prompt at once,
    ``function(responses, **fields) -> list``."""
    setattr(function, _FORM_ATTRIBUTE, "group")
    return function


def reward_form(function: Callable[..., Any], form: str | None = None) -> str:
    """``form`` when given, else the one :func:`batch_reward`/:func:`group_reward` marked."""
    chosen = form or getattr(function, _FORM_ATTRIBUTE, "single")
    if chosen not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {chosen!r}")
    return chosen


def accepted_fields(function: Callable[..., Any], skip: int = 1) -> set[str] | None:
    """The keyword names ``function`` accepts after its first ``skip`` parameters; None when it
    takes ``**kwargs`` (everything)."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: give it everything
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in parameters[skip:] if p.kind in named}


def pick(values: dict[str, Any], accepted: set[str] | None) -> dict[str, Any]:
    """The items of ``values`` a function accepts (:func:`accepted_fields`)."""
    return dict(values) if accepted is None else {k: v for k, v in values.items() if k in accepted}


@dataclass
class RewardFunction:
    """One reward function with its weight, form and fault settings.

    ``name`` (default: the function's ``__name__``) names its metrics: ``<name>/score_mean``
    and ``<name>/failures``.
    """

    function: Callable[..., Any]
    weight: float = 1.0
    name: str | None = None
    form: str | None = None
    timeout_s: float | None = 30.0
    fallback_reward: float = 0.0
    correct_at: float = 1.0
    guard: GuardedCall = field(init=False, repr=False)
    _accepted: set[str] | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.name = self.name or getattr(self.function, "__name__", "reward")
        self.form = reward_form(self.function, self.form)
        self.guard = GuardedCall(self.name, self.fallback_reward, self.timeout_s, self.correct_at)
        self._accepted = accepted_fields(self.function)

    def score_rows(
        self, replies: Sequence[str], rows: Sequence[dict[str, Any]], groups: Sequence[int]
    ) -> list[Outcome]:
        """Each reply's outcome; ``rows[i]`` holds reply ``i``'s fields, ``groups[i]`` its
        GRPO group (replies of one group share their row's fields)."""
        if self.form == "batch":
            columns = {name: [row.get(name) for row in rows] for name in _names(rows)}
            return self.guard.many(
                self.function, len(replies), list(replies), **pick(columns, self._accepted)
            )
        if self.form == "group":
            outcomes: list[Outcome | None] = [None] * len(replies)
            for members in group_members(groups).values():
                found = self.guard.many(
                    self.function,
                    len(members),
                    [replies[i] for i in members],
                    **pick(rows[members[0]], self._accepted),
                )
                for index, outcome in zip(members, found, strict=True):
                    outcomes[index] = outcome
            return [outcome for outcome in outcomes if outcome is not None]
        calls = [
            (self.function, (reply,), pick(row, self._accepted))
            for reply, row in zip(replies, rows, strict=True)
        ]
        return self.guard.each(calls)


@dataclass(frozen=True)
class RowScore:
    """A reply's combined score, whether any part failed, and each function's outcome."""

    score: Score
    failed: bool
    parts: dict[str, Outcome]


class RewardFunctionTask:
    """A task made of weighted reward functions: a row's reward is ``sum_i weight_i * r_i``;
    it is correct when the first function says so (return a :class:`Score` to decide what
    correct means; a plain number counts when it is at least ``correct_at``).

    ``instructions`` is the system prompt (the answer format the functions expect).
    """

    def __init__(
        self,
        functions: Sequence[RewardFunction],
        instructions: str = DEFAULT_INSTRUCTIONS,
        name: str | None = None,
    ) -> None:
        if not functions:
            raise ValueError("a reward-function task needs at least one function")
        names = [f.name for f in functions]
        if len(set(names)) != len(names):
            raise ValueError(f"reward function names must be unique, got {names}")
        self.functions = list(functions)
        self.instructions = instructions
        self.name = name or "+".join(str(n) for n in names)

    def score(self, response: str, answer: str, **fields: Any) -> Score:
        """One reply's combined score (outside a batch: evaluation scripts, tests)."""
        return self.score_rows([response], [{"answer": answer, **fields}], [0])[0].score

    def score_rows(
        self, replies: Sequence[str], rows: Sequence[dict[str, Any]], groups: Sequence[int]
    ) -> list[RowScore]:
        """Every reply's :class:`RowScore` (see :meth:`RewardFunction.score_rows`)."""
        each = {f.name: f.score_rows(replies, rows, groups) for f in self.functions}
        scores = []
        for index in range(len(replies)):
            parts = {str(name): outcomes[index] for name, outcomes in each.items()}
            first = parts[str(self.functions[0].name)].score
            reward = sum(f.weight * parts[str(f.name)].reward for f in self.functions)
            scores.append(
                RowScore(
                    Score(reward, first.correct, first.formatted, first.parsed),
                    failed=any(outcome.failed for outcome in parts.values()),
                    parts=parts,
                )
            )
        return scores

    def kind(self, problem: Any) -> str | None:
        """The problem's ``kind`` column, for per-kind accuracy in the evaluation."""
        kind = getattr(problem, "fields", {}).get("kind")
        return kind if isinstance(kind, str) else None


def _names(rows: Sequence[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    return list(names)


def group_members(groups: Sequence[int]) -> dict[int, list[int]]:
    """The row indices of each GRPO group, in order, by group id."""
    members: dict[int, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(int(group), []).append(index)
    return members
