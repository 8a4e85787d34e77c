"""Arithmetic task: generator determinism, splits, precedence, worked solutions and scoring."""

from __future__ import annotations

import re

import pytest

from llmrl.envs.tasks.arithmetic import ArithmeticTask, _has_negative_step, evaluate
from llmrl.envs.tasks.base import Task

_EXPRESSION = re.compile(r"[0-9]+(?: [-+*] [0-9]+)+")


def test_is_a_task() -> None:
    assert isinstance(ArithmeticTask(), Task)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_operands": 1}, "num_operands"),
        ({"num_operands": 2.0}, "num_operands"),
        ({"digits": 0}, "digits"),
        ({"digits": 7}, "digits"),
        ({"operators": ""}, "operators"),
        ({"operators": "+/"}, "operators"),
        ({"format_reward": 1.0}, "format_reward"),
        ({"format_reward": -0.1}, "format_reward"),
        ({"nonnegative": "yes"}, "nonnegative"),
        ({"instructions": "Answer with a number."}, "instructions"),  # no '####': never scored
        ({"instructions": 3}, "instructions"),
    ],
)
def test_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ArithmeticTask(**kwargs)


def test_evaluate_precedence_and_steps() -> None:
    assert evaluate([37, 8, 12], ["+", "*"]) == (133, ["8 * 12 = 96", "37 + 96 = 133"])
    assert evaluate([2, 3, 4], ["*", "*"]) == (24, ["2 * 3 = 6", "6 * 4 = 24"])
    assert evaluate([10, 3, 2], ["-", "+"]) == (9, ["10 - 3 = 7", "7 + 2 = 9"])
    assert evaluate([3, 8], ["-"]) == (-5, ["3 - 8 = -5"])
    with pytest.raises(ValueError, match="operator"):
        evaluate([1, 2], ["/"])


def test_fixed_seed_problems() -> None:
    # Checked by hand: 67*96 = 6700 - 268; 98*71 = 7100 - 142 = 6958, minus 22.
    problems = ArithmeticTask().generate(3, seed=0)
    assert [(p.prompt, p.answer) for p in problems] == [
        ("What is 67 * 96?", "6432"),
        ("What is 50 * 52?", "2600"),
        ("What is 18 + 55?", "73"),
    ]
    assert [p.id for p in problems] == [f"arithmetic-train-0-{i}" for i in range(3)]
    problems = ArithmeticTask(num_operands=4).generate(3, seed=7, split="eval")
    assert [(p.prompt, p.answer) for p in problems] == [
        ("What is 98 * 71 - 2 * 11?", "6936"),
        ("What is 70 * 11 + 17 + 51?", "838"),
        ("What is 11 - 56 - 69 - 23?", "-137"),
    ]
    assert problems[0].sft_target == "98 * 71 = 6958\n2 * 11 = 22\n6958 - 22 = 6936\n#### 6936"
    assert problems[2].sft_target == "11 - 56 = -45\n-45 - 69 = -114\n-114 - 23 = -137\n#### -137"


@pytest.mark.parametrize(
    "task",
    [ArithmeticTask(), ArithmeticTask(num_operands=5, digits=3), ArithmeticTask(operators="-*")],
)
def test_answers_match_python(task: ArithmeticTask) -> None:
    for problem in task.generate(200, seed=3):
        expression = problem.prompt.removeprefix("What is ").removesuffix("?")
        assert _EXPRESSION.fullmatch(expression), expression  # digits and operators only
        assert problem.answer == str(eval(expression))  # test-only cross-check
        assert task.score(problem.sft_target, problem.answer).reward == 1.0


def test_operators_and_digits_respected() -> None:
    problems = ArithmeticTask(num_operands=3, digits=1, operators="+").generate(50, seed=1)
    for problem in problems:
        operands = problem.meta["operands"]
        assert len(operands) == 3 and all(1 <= x <= 9 for x in operands)
        assert problem.meta["operators"] == ["+", "+"]


def test_nonnegative_redraws_every_negative_step() -> None:
    plain = ArithmeticTask(num_operands=3, digits=2, operators="-").generate(200, seed=3)
    assert sum(int(p.answer) < 0 for p in plain) > 100  # most 3-operand differences go below 0
    task = ArithmeticTask(num_operands=3, digits=2, operators="-+", nonnegative=True)
    problems = task.generate(200, seed=3)
    assert any("-" in p.meta["operators"] for p in problems)
    for problem in problems:
        steps = problem.sft_target.splitlines()[:-1]  # "a op b = c" lines, then "#### c"
        assert all(int(step.rsplit("= ", 1)[1]) >= 0 for step in steps), problem.sft_target
    # "10 - 30 + 25" ends at 5 but passes through -20: it is redrawn too.
    assert _has_negative_step([10, 30, 25], ["-", "+"])
    assert not _has_negative_step([30, 10, 25], ["-", "+"])


def test_determinism() -> None:
    task = ArithmeticTask(num_operands=3)
    assert task.generate(50, seed=5) == task.generate(50, seed=5)
    assert task.generate(50, seed=5) != task.generate(50, seed=6)


def test_splits_disjoint_and_unique() -> None:
    task = ArithmeticTask(num_operands=3)
    prompts = {
        split: [p.prompt for p in task.generate(count, seed=seed, split=split)]
        for split, count, seed in [("train", 2000, 0), ("eval", 200, 1), ("test", 200, 0)]
    }
    for items in prompts.values():
        assert len(set(items)) == len(items)
    assert not set(prompts["train"]) & set(prompts["eval"])
    assert not set(prompts["train"]) & set(prompts["test"])
    assert not set(prompts["eval"]) & set(prompts["test"])


def test_generate_errors() -> None:
    task = ArithmeticTask(digits=1, operators="+")  # only 81 problems exist
    with pytest.raises(ValueError, match=r"only .* distinct"):
        task.generate(50, seed=0, split="eval")
    with pytest.raises(ValueError, match="split"):
        task.generate(1, seed=0, split="validation")
    with pytest.raises(ValueError, match="count"):
        task.generate(-1, seed=0)
    assert task.generate(0, seed=0) == []


@pytest.mark.parametrize(
    ("response", "reward", "correct", "formatted"),
    [
        ("8 * 12 = 96\n37 + 96 = 133\n#### 133", 1.0, True, True),
        ("####133", 1.0, True, True),
        ("#### 133.", 1.0, True, True),
        ("#### 133.00", 1.0, True, True),
        ("#### 1\nno wait\n#### 133", 1.0, True, True),
        ("#### 133\nno wait\n#### 134", 0.1, False, True),  # the last #### wins
        ("#### 134", 0.1, False, True),
        ("The answer is 133.", 0.0, False, False),  # no #### line
        ("#### one hundred thirty-three", 0.0, False, False),
        ("", 0.0, False, False),
    ],
)
def test_score(response: str, reward: float, correct: bool, formatted: bool) -> None:
    score = ArithmeticTask().score(response, "133")
    assert (score.reward, score.correct, score.formatted) == (reward, correct, formatted)


def test_score_negative_and_custom_format_reward() -> None:
    task = ArithmeticTask(format_reward=0.0)
    assert task.score("#### −137", "-137").correct
    assert task.score("#### 137", "-137").reward == 0.0
