"""A user's reward code, as the tests import it by path (``tests.support.user_rewards:exact``):
each form of reward function, a task class, and functions that fail in every way user code can."""

from __future__ import annotations

import asyncio
import time

from llmrl.envs.tasks import Score, batch_reward, group_reward

HANG_S = 5.0
"""How long the hanging functions sleep: far past the tests' timeouts."""
REMOTE_S = 0.5
"""How long :func:`remote`'s service call takes."""


def exact(response: str, answer: str, unit: str) -> Score:
    """1 when the reply ends with the answer and the row's ``unit`` column."""
    right = response.strip().endswith(f"{answer} {unit}")
    return Score(float(right), correct=right, formatted=unit in response)


@group_reward
def shortest(responses: list[str], **fields: object) -> list[float]:
    """1 for the shortest replies of a group, 0 for the others."""
    best = min(len(r) for r in responses)
    return [1.0 if len(r) == best else 0.0 for r in responses]


@batch_reward
def length_share(responses: list[str], answer: list[str]) -> list[float]:
    """Each reply's share of the batch's characters (answers must come as a list)."""
    assert isinstance(answer, list) and len(answer) == len(responses)
    total = sum(len(r) for r in responses)
    return [len(r) / total for r in responses]


def raises(response: str, **fields: object) -> float:
    raise KeyError("no such column")


def hangs(response: str) -> float:
    time.sleep(HANG_S)
    return 1.0


def returns_nan(response: str) -> float:
    return float("nan")


def returns_text(response: str) -> str:
    return "one"


def short_list(responses: list[str]) -> list[float]:
    return [1.0]


async def remote(response: str, answer: str) -> float:
    """A service call: waits a little, then scores."""
    await asyncio.sleep(REMOTE_S)
    return float(response.strip() == answer)


async def remote_hangs(response: str) -> float:
    await asyncio.sleep(HANG_S)
    return 1.0


class UnitTask:
    """A task class with options: the reply must end with the answer and ``unit``."""

    instructions = "Answer with a number and its unit."

    def __init__(self, bonus: float = 0.0) -> None:
        self.name = "unit-task"
        self.bonus = bonus

    def score(self, response: str, answer: str, unit: str = "") -> Score:
        right = response.strip() == f"{answer} {unit}"
        return Score(float(right) + self.bonus, correct=right)


class BrokenTask(UnitTask):
    """A task class whose score raises on every row."""

    def score(self, response: str, answer: str, **fields: object) -> Score:
        raise ZeroDivisionError("bug in the user's task")


class PairTask(UnitTask):
    """A task class with a group form: within a group, 1 for a reply that repeats another."""

    def score_group(self, responses: list[str], answer: str, unit: str) -> list[float]:
        return [float(responses.count(r) > 1) for r in responses]
