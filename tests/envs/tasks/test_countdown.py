"""Countdown: the safe expression parser, scoring attacks and solvable generated problems."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from llmrl.envs.tasks.base import Task
from llmrl.envs.tasks.countdown import CountdownTask, extract_expression, parse_expression

ANSWER = json.dumps({"numbers": [3, 5, 2], "target": 16})


def test_is_a_task() -> None:
    assert isinstance(CountdownTask(), Task)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_numbers": 1}, "num_numbers"),
        ({"num_numbers": 7}, "num_numbers"),
        ({"max_number": 1}, "max_number"),
        ({"max_target": 0}, "max_target"),
        ({"format_reward": 1.0}, "format_reward"),
    ],
)
def test_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CountdownTask(**kwargs)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("#### (3 + 5) * 2", "(3 + 5) * 2"),
        ("#### `(3 + 5) * 2`.", "(3 + 5) * 2"),
        ("#### `(3 + 5) * 2.`", "(3 + 5) * 2"),
        ("#### (3 + 5) * 2 = 16", "(3 + 5) * 2"),
        ("#### 1\n#### 2 * 8\nthanks", "2 * 8"),
        ("no marker", None),
        ("#### ", None),
    ],
)
def test_extract_expression(response: str, expected: str | None) -> None:
    assert extract_expression(response) == expected


@pytest.mark.parametrize(
    "expression",
    ["(1 + 2) * 3", "-3 + 5", "8 / (4 - 2)", "((7))", "3 × 5 ÷ 1 − 2"],
)
def test_parse_accepts(expression: str) -> None:
    assert parse_expression(expression) is not None


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "__import__('os').system('ls')",
        "2**100000",
        "9 // 3",
        "9 % 3",
        "1.5 * 2",
        "3e2",
        "x + 1",
        "abs(3)",
        "True + 1",
        "'3'",
        "[1, 2]",
        "+3",  # unary plus is not in the grammar
        "1_0",
        "0x10",
        "007",
        "3 +",
        "()",
        "1 < 2",
        "(" * 150 + "1" + ")" * 150,
        " + ".join(["1"] * 120),  # over the 200-character cap
    ],
)
def test_parse_rejects(expression: str) -> None:
    assert parse_expression(expression) is None


@pytest.mark.parametrize(
    ("response", "reward", "correct", "formatted"),
    [
        ("#### (3 + 5) * 2", 1.0, True, True),
        ("#### 2*(5+3)", 1.0, True, True),
        ("Let me try.\n#### 3 * 5 + 2\nHmm no.\n#### (5 + 3) * 2 = 16", 1.0, True, True),
        ("#### 5 * 3 - (-2) / 2 * -2", 0.1, False, True),  # uses 2 twice
        ("#### -(3 - 5) * 8", 0.1, False, True),  # 8 is not given
        ("#### 3 + 5 + 2", 0.1, False, True),  # right numbers, wrong value
        ("#### (1 + 2) * 3", 0.1, False, True),  # 3 used twice, 5 and 2 unused
        ("#### 16", 0.1, False, True),  # just the target
        ("#### 2 / (5 - 5) * 3", 0.1, False, True),  # division by zero: wrong, no crash
        ("#### __import__('os')", 0.0, False, False),
        ("#### 2**100000", 0.0, False, False),
        ("#### 3.0 * 5 + 2", 0.0, False, False),  # float literal
        ("#### a * b", 0.0, False, False),
        ("#### " + "+".join(["3"] * 150), 0.0, False, False),  # too long
        ("(3 + 5) * 2", 0.0, False, False),  # no ####
        ("", 0.0, False, False),
    ],
)
def test_score(response: str, reward: float, correct: bool, formatted: bool) -> None:
    score = CountdownTask().score(response, ANSWER)
    assert (score.reward, score.correct, score.formatted) == (reward, correct, formatted)


def test_score_division_by_zero_with_matching_numbers() -> None:
    answer = json.dumps({"numbers": [6, 3, 3], "target": 1})
    score = CountdownTask(num_numbers=3).score("#### 6 / (3 - 3)", answer)
    assert (score.reward, score.correct, score.formatted) == (0.1, False, True)
    assert CountdownTask(num_numbers=3).score("#### 6 / (3 + 3)", answer).correct


def test_score_exact_fractions() -> None:
    answer = json.dumps({"numbers": [1, 3, 3], "target": 1})
    assert CountdownTask().score("#### (1 / 3) * 3", answer).correct  # no float rounding
    assert CountdownTask().score("#### 3 / 3 * 1", answer).correct


def test_fixed_seed_problems() -> None:
    problems = CountdownTask().generate(3, seed=0)
    assert [json.loads(p.answer) for p in problems] == [
        {"numbers": [20, 60, 10, 30], "target": 60},  # (60 + 20) - (30 - 10) = 80 - 20
        {"numbers": [66, 100, 70, 86], "target": 600},  # (86 - 66) * (100 - 70) = 20 * 30
        {"numbers": [15, 24, 97, 24], "target": 82},  # 97 - 24 + 24 - 15
    ]
    assert problems[1].meta["solution"] == "(86 - 66) * (100 - 70)"
    assert problems[1].prompt == (
        "Using the numbers [66, 100, 70, 86] exactly once each, with + - * / and parentheses, "
        "write an expression equal to 600. Put the expression after ####."
    )
    assert problems[1].sft_target.endswith("\n#### (86 - 66) * (100 - 70)")


@pytest.mark.parametrize(
    "task",
    [CountdownTask(), CountdownTask(num_numbers=3, max_number=20), CountdownTask(num_numbers=6)],
)
def test_generated_problems_are_solvable(task: CountdownTask) -> None:
    for problem in task.generate(300, seed=11):
        spec = json.loads(problem.answer)
        assert len(spec["numbers"]) == task.num_numbers
        assert all(1 <= n <= task.max_number for n in spec["numbers"])
        assert 1 <= spec["target"] <= task.max_target
        solution = problem.meta["solution"]
        assert Counter(map(int, re.findall(r"[0-9]+", solution))) == Counter(spec["numbers"])
        assert task.score(f"#### {solution}", problem.answer).correct
        assert task.score(problem.sft_target, problem.answer).reward == 1.0


def test_determinism() -> None:
    task = CountdownTask()
    assert task.generate(30, seed=2) == task.generate(30, seed=2)
    assert task.generate(30, seed=2) != task.generate(30, seed=3)


def test_splits_disjoint() -> None:
    task = CountdownTask(num_numbers=3, max_number=30)

    def keys(split: str, count: int) -> set[str]:
        problems = task.generate(count, seed=0, split=split)
        specs = [json.loads(p.answer) for p in problems]
        keyed = {f"{sorted(s['numbers'])}->{s['target']}" for s in specs}
        assert len(keyed) == count  # no duplicates, even reordered, within a split
        return keyed

    train, eval_, test = keys("train", 1000), keys("eval", 100), keys("test", 100)
    assert not train & eval_ and not train & test and not eval_ & test
