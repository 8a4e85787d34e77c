"""Reward functions for unit conversion.

Each gets the model's reply and the fields of its dataset row (every column of
``data/units.jsonl``: ``answer``, ``to_unit``, ``kind``, ...) as keyword arguments, and returns
a number or an ``llmrl`` ``Score``.
"""

from __future__ import annotations

import re

from llmrl.envs.tasks import Score, group_reward

ANSWER = re.compile(r"Answer:\s*(-?\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")


def final_answer(reply: str) -> tuple[float, str] | None:
    """The number and unit of the reply's last line ``Answer: <number> <unit>``, if any."""
    found = ANSWER.search(reply.strip())
    return (float(found.group(1)), found.group(2)) if found else None


def correct_value(response: str, answer: str, to_unit: str) -> Score:
    """1 for the right number in the asked unit; 0.1 for a well-formed but wrong answer."""
    parsed = final_answer(response)
    if parsed is None:
        return Score(0.0, correct=False, formatted=False)
    right = abs(parsed[0] - float(answer)) < 1e-9 and parsed[1] == to_unit
    return Score(1.0 if right else 0.1, correct=right, parsed=f"{parsed[0]:g} {parsed[1]}")


@group_reward
def concise(responses: list[str], **fields: object) -> list[float]:
    """A group's rank by length: the shortest reply 1, the longest 0 (ties share a rank).

    A group form: it compares the G replies to one prompt, which one reply alone cannot.
    """
    lengths = sorted({len(r) for r in responses})
    if len(lengths) == 1:
        return [0.5] * len(responses)
    rank = {length: index / (len(lengths) - 1) for index, length in enumerate(lengths)}
    return [1.0 - rank[len(r)] for r in responses]
