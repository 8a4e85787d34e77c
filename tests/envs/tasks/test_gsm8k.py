"""GSM8K: answer-field parsing, SFT targets, rows and scoring (plus real rows when present)."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest

from llmrl.envs.tasks.base import Task
from llmrl.envs.tasks.gsm8k import (
    GSM8KTask,
    load_problems,
    problem_from_row,
    reference_answer,
    sft_target,
    strip_calculator_annotations,
)

TRAIN = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "gsm8k" / "train.jsonl"
ROW = {
    "question": "Natalia sold clips to 48 of her friends in April, and then half as many in May.",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nIn total 48+24 = <<48+24=72>>72.\n"
    "#### 72",
}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """The first 30 rows of the real GSM8K train split (skips when the data is absent)."""
    if not TRAIN.is_file():
        pytest.skip(f"GSM8K data not found at {TRAIN}")
    with TRAIN.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in islice(lines, 30)]


def test_is_a_task() -> None:
    assert isinstance(GSM8KTask(), Task)
    with pytest.raises(ValueError, match="format_reward"):
        GSM8KTask(format_reward=1.5)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("work\n#### 72", "72"),
        ("work\n#### 1,234", "1234"),
        ("#### -3", "-3"),
        ("#### 0.50", "0.5"),
        ("#### 1\nmore work\n#### 2", "2"),
    ],
)
def test_reference_answer(answer: str, expected: str) -> None:
    assert reference_answer(answer) == expected


@pytest.mark.parametrize("answer", ["72", "the answer is 72", "#### seventy-two", ""])
def test_reference_answer_missing(answer: str) -> None:
    with pytest.raises(ValueError, match=r"no '#### <number>' line in the answer"):
        reference_answer(answer)


def test_strip_calculator_annotations() -> None:
    assert strip_calculator_annotations("48/2 = <<48/2=24>>24 and $<<12/60=0.2>>0.2") == (
        "48/2 = 24 and $0.2"
    )
    assert strip_calculator_annotations("no annotations") == "no annotations"


def test_sft_target() -> None:
    assert sft_target(ROW["answer"]) == (
        "Natalia sold 48/2 = 24 clips in May.\nIn total 48+24 = 72.\n#### 72"
    )
    assert sft_target("#### 1,000") == "#### 1000"


def test_problem_from_row() -> None:
    problem = problem_from_row(ROW, 42, "train")
    assert problem.id == "gsm8k-train-00042"
    assert problem.prompt == ROW["question"]
    assert problem.answer == "72"
    assert problem.sft_target is not None and "<<" not in problem.sft_target


@pytest.mark.parametrize("missing", ["question", "answer"])
def test_problem_from_row_missing_field(missing: str) -> None:
    row = {key: value for key, value in ROW.items() if key != missing}
    with pytest.raises(ValueError, match=f"'{missing}'"):
        problem_from_row(row, 0, "train")


def test_problem_from_row_bad_answer() -> None:
    with pytest.raises(ValueError, match=r"'answer'.*####"):
        problem_from_row({"question": "q", "answer": "no final line"}, 3, "test")


@pytest.mark.parametrize(
    ("response", "reward", "correct", "formatted"),
    [
        ("48 + 24 = 72\n#### 72", 1.0, True, True),
        ("#### $72.00", 1.0, True, True),
        ("####72", 1.0, True, True),
        ("#### 70\nWait, recount.\n#### 72", 1.0, True, True),
        ("#### 71", 0.0, False, True),  # format_reward defaults to 0
        ("She sold 72 clips.", 0.0, False, False),
    ],
)
def test_score(response: str, reward: float, correct: bool, formatted: bool) -> None:
    score = GSM8KTask().score(response, "72")
    assert (score.reward, score.correct, score.formatted) == (reward, correct, formatted)


def test_score_format_reward() -> None:
    assert GSM8KTask(format_reward=0.2).score("#### 71", "72").reward == 0.2
    assert GSM8KTask(format_reward=0.2).score("#### 1,234", "1234").reward == 1.0


def test_real_rows(rows: list[dict]) -> None:
    task = GSM8KTask()
    assert len(rows) == 30
    for index, row in enumerate(rows):
        problem = problem_from_row(row, index, "train")
        assert problem.answer == row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        assert "<<" not in problem.sft_target and ">>" not in problem.sft_target
        assert problem.sft_target.endswith(f"\n#### {problem.answer}")
        assert task.score(problem.sft_target, problem.answer).reward == 1.0
    assert rows[0]["answer"].endswith("#### 72")  # Natalia's clips: 48 + 24


def test_load_problems(rows: list[dict]) -> None:
    problems = load_problems(TRAIN, "train", limit=30)
    assert [p.answer for p in problems] == [problem_from_row(r, 0, "train").answer for r in rows]
    assert problems[29].id == "gsm8k-train-00029"
