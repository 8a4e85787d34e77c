"""GSM8K grade-school math: parse the dataset's rows, score ``#### <number>`` answers.

A GSM8K ``answer`` field is a worked solution with calculator annotations (``<<48/2=24>>``) and
a last line ``#### 72``. The reference is that number, normalized (see
:mod:`llmrl.envs.tasks.numbers`); the SFT target is the solution without annotations, ending in
``#### <normalized number>`` -- the same format the arithmetic task teaches.

Example:
    >>> answer = "She sold 48/2 = <<48/2=24>>24 clips.\\n#### 1,024"
    >>> reference_answer(answer), sft_target(answer)
    ('1024', 'She sold 48/2 = 24 clips.\\n#### 1024')
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from llmrl.data.problem import Problem
from llmrl.envs.tasks.base import Score, check_format_reward, check_split
from llmrl.envs.tasks.numbers import (
    FINAL_ANSWER_INSTRUCTIONS,
    extract_final_answer,
    score_final_answer,
)

_ANNOTATION = re.compile(r"<<[^<>]*>>")


def reference_answer(answer_field: str) -> str:
    """The normalized final number of a GSM8K ``answer`` field (its last ``####`` line).

    Example:
        >>> reference_answer("Half of 48 is <<48/2=24>>24.\\n#### 24")
        '24'
    """
    number = extract_final_answer(answer_field)
    if number is None:
        raise ValueError("no '#### <number>' line in the answer")
    return number


def strip_calculator_annotations(text: str) -> str:
    """Remove GSM8K's ``<<expression=result>>`` calculator annotations.

    Example:
        >>> strip_calculator_annotations("48/2 = <<48/2=24>>24")
        '48/2 = 24'
    """
    return _ANNOTATION.sub("", text)


def sft_target(answer_field: str) -> str:
    """The worked solution without annotations, its last line rewritten as ``#### <number>``."""
    number = reference_answer(answer_field)
    text = strip_calculator_annotations(answer_field)
    body = text[: text.rfind("####")].rstrip()
    return f"{body}\n#### {number}" if body else f"#### {number}"


def problem_from_row(row: dict, index: int, split: str) -> Problem:
    """One GSM8K row (``question``, ``answer``) as a :class:`Problem` with id ``gsm8k-<split>-<i>``.

    Example:
        >>> row = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\\n#### 4"}
        >>> problem_from_row(row, 3, "train").id
        'gsm8k-train-00003'
    """
    for name in ("question", "answer"):
        if name not in row:
            raise ValueError(f"GSM8K row {index} has no {name!r} field")
        if not isinstance(row[name], str):
            raise ValueError(f"GSM8K row {index}: field {name!r} must be a string")
    try:
        answer = reference_answer(row["answer"])
    except ValueError as error:
        raise ValueError(f"GSM8K row {index}, field 'answer': {error}") from None
    return Problem(
        id=f"gsm8k-{split}-{index:05d}",
        prompt=row["question"].strip(),
        answer=answer,
        sft_target=sft_target(row["answer"]),
        meta={"split": split, "index": index},
    )


def load_problems(path: str | Path, split: str, limit: int | None = None) -> list[Problem]:
    """Read a GSM8K JSONL file (one row per line) into problems; ``limit`` caps the row count.

    ``split`` must be ``train``, ``eval`` or ``test``; GSM8K's own test file maps to ``test``.
    """
    check_split(split)
    problems: list[Problem] = []
    with Path(path).open(encoding="utf-8") as lines:
        for index, line in enumerate(lines):
            if limit is not None and len(problems) >= limit:
                break
            if line.strip():
                problems.append(problem_from_row(json.loads(line), index, split))
    return problems


@dataclass(frozen=True)
class GSM8KTask:
    """GSM8K scored by exact match of the last ``#### <number>`` against the reference.

    Reward: 1.0 right, ``format_reward`` for a ``####`` answer that is wrong, 0.0 without one.
    """

    format_reward: float = 0.0

    name = "gsm8k"
    instructions = FINAL_ANSWER_INSTRUCTIONS

    def __post_init__(self) -> None:
        object.__setattr__(self, "format_reward", check_format_reward(self.format_reward))

    def score(self, response: str, problem_answer: str) -> Score:
        """Exact match of the last ``#### <number>`` against the reference answer."""
        return score_final_answer(response, problem_answer, self.format_reward)
