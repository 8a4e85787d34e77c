"""Shared vocabulary of the task definitions: a dataset row, a reward, the task protocol, splits.

A *task* turns a model response into a :class:`Score` against a reference answer; its generator
(where it has one) turns a seed into :class:`Problem` rows. Everything here is pure Python so
reward parsing can run anywhere (rollout workers, tests, notebooks) without torch.

Splits are assigned by content, not by seed: :func:`split_of` hashes a problem's key into
``train`` (80%), ``eval`` (10%) or ``test`` (10%), so two splits never share a problem whatever
seeds they were generated with.

Example:
    >>> Score(reward=1.0, correct=True, formatted=True, parsed="42").correct
    True
    >>> split_of("2 + 3") in SPLITS
    True
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

SPLITS = ("train", "eval", "test")
_SPLIT_BUCKETS = {0: "eval", 1: "test"}  # of 10 buckets; the other 8 are train
_MAX_MISSES = 20_000

ANSWER_WINDOW_CHARS = 20_000
"""Scorers look for a response's final answer (``\\boxed{}``, ``#### ...``) in its last this many
characters only: the answer sits at the end, and a hostile response of any length then costs
the parser at most this much (linear) work."""


@dataclass(frozen=True)
class Score:
    """The reward of one response, plus what the parser saw (for logs and metrics).

    ``correct``: the answer is right (accuracy). ``formatted``: the response used the required
    final-answer format. ``parsed``: what was extracted from the response, ``None`` when nothing
    was. A user's reward function may return a ``Score`` or a plain number.
    """

    reward: float
    correct: bool
    formatted: bool = True
    parsed: str | None = None


@runtime_checkable
class Task(Protocol):
    """What the env layer needs from a task: a name, the answer-format instructions, a scorer.

    ``score(response, answer, **fields)`` returns a :class:`Score` or a number; it gets, as
    keyword arguments, the fields of the row (``Problem.fields``: every extra column of the
    user's dataset) that its signature names (all of them when it takes ``**fields``). Optional
    hooks, found by name: ``generate(count, seed, split) -> list[Problem]`` (a generated task:
    ``llmrl prepare`` calls it when no source is given), ``score_group(responses, answer,
    **fields)`` (all replies of a GRPO group in one call), ``env_options() -> dict``
    (``transforms``, ``max_turns``, ``system_prompt``, ``reward``: multi-turn environments, see
    :class:`~llmrl.envs.task_env.TaskEnv`) and ``close()``. A task must pickle: env workers
    receive it.
    """

    name: str
    instructions: str

    def score(self, response: str, problem_answer: str) -> Score: ...


def check_format_reward(format_reward: float) -> float:
    """Validate a partial reward for a well-formatted but wrong answer: ``0 <= r < 1``."""
    if isinstance(format_reward, bool) or not isinstance(format_reward, (int, float)):
        raise ValueError(f"format_reward must be a number, got {format_reward!r}")
    if not 0.0 <= format_reward < 1.0:
        raise ValueError(f"format_reward must be in [0, 1), got {format_reward}")
    return float(format_reward)


def check_split(split: str) -> str:
    """Reject split names other than ``train``, ``eval`` and ``test``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


def split_of(key: str) -> str:
    """The split a problem belongs to, from a stable hash of its key (its canonical text).

    Example:
        >>> split_of("37 + 8 * 12") == split_of("37 + 8 * 12")
        True
    """
    bucket = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % 10
    return _SPLIT_BUCKETS.get(bucket, "train")


T = TypeVar("T")


def sample_split(
    count: int,
    seed: int,
    split: str,
    draw: Callable[[random.Random], T],
    key: Callable[[T], str],
    what: str,
) -> list[T]:
    """Draw ``count`` distinct items of ``split``, deterministically from ``seed``.

    Items are drawn from ``random.Random(f"{seed}-{split}")`` and kept when their key hashes to
    ``split`` (see :func:`split_of`) and has not been seen yet. Raises ``ValueError`` when the
    problem space runs dry (too many draws in a row without a new item), naming ``what``.
    """
    check_split(split)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative int, got {count!r}")
    rng = random.Random(f"{seed}-{split}")
    items: list[T] = []
    seen: set[str] = set()
    misses = 0
    while len(items) < count:
        item = draw(rng)
        item_key = key(item)
        if item_key in seen or split_of(item_key) != split:
            misses += 1
            if misses > _MAX_MISSES:
                raise ValueError(
                    f"only {len(items)} distinct {what} problems found for split {split!r} "
                    f"(asked for {count}); make the task harder to enlarge the problem space"
                )
            continue
        misses = 0
        seen.add(item_key)
        items.append(item)
    return items
