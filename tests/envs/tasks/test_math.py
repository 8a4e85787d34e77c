"""MATH: boxed-answer extraction, math-verify equivalence, rows, the verification time bound
(also off the main thread), kinds, and ``llmrl prepare`` round trips over JSONL and Parquet."""

from __future__ import annotations

import doctest
import json
import logging
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import llmrl.envs.tasks.math as math_module
from llmrl.cli import main
from llmrl.config import PrepareConfig
from llmrl.data.datasets import DatasetError
from llmrl.data.prepare import load_prepared, prepare_dataset
from llmrl.envs.tasks import TASKS, make_task
from llmrl.envs.tasks.base import Task
from llmrl.envs.tasks.math import (
    MATH_INSTRUCTIONS,
    MathTask,
    last_boxed,
    problem_from_row,
    reference_answer,
)
from llmrl.eval.kinds import accuracy_by_kind, kind_metrics, problem_kinds

HOSTILE = r"\boxed{9^{9^{9^{9}}}}"
"""An answer sympy cannot compare with ``1`` in any reasonable time (measured: math-verify's own
signal timeout fires after its 5 s; without a bound it does not return)."""
BOUND_SECONDS = 0.5
GENEROUS_WALL = 20.0
"""What a bounded hostile check must finish within: the bound plus starting a fresh worker, with
room for a loaded machine; an unbounded check does not finish at all."""

ROWS = [
    {
        "problem": "What is $\\frac{1}{4} + \\frac{1}{4}$?",
        "solution": "Adding, $\\frac{1}{4} + \\frac{1}{4} = \\boxed{\\frac{1}{2}}$.",
        "level": "Level 1",
        "type": "Prealgebra",
    },
    {
        "problem": "Solve $x + 1 = 4$.",
        "solution": "Subtract 1: $x = \\boxed{3}$.",
        "level": "Level 2",
        "type": "Algebra",
    },
    {
        "problem": "In how many ways can 2 of 4 people be chosen?",
        "solution": "$\\binom{4}{2} = \\boxed{6}$",
        "level": "Level 2",
        "type": "Counting & Probability",
    },
    {"problem": "Give the interval where $x^2 < 1$.", "answer": "(-1, 1)"},
]


@pytest.fixture(scope="module")
def task() -> MathTask:
    return MathTask()


# ------------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so $\boxed{5}$", "5"),
        (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{\sqrt{\frac{a}{b^{2}}}} done", r"\sqrt{\frac{a}{b^{2}}}"),
        (r"$\boxed 5$", "5"),  # the space form, up to the closing $
        (r"the answer is \boxed 12.", "12"),  # ...without the sentence's full stop
        (r"\boxed5", "5"),
        (r"\fbox{7}", "7"),
        (r"\boxed{1} no, \boxed{2} no, \fbox{3}", "3"),  # the last one wins
        (r"\boxed{1} then a truncated \boxed{2", "1"),  # an unclosed box does not count
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are not grouping
        (r"\boxed{ x = 3 }", "x = 3"),
        (r"\boxed  {4}", "4"),
    ],
)
def test_last_boxed(text: str, expected: str) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "text", ["no box here", r"\boxed{}", r"\boxed{  }", r"\boxed{unclosed", r"\boxedx{3}", ""]
)
def test_last_boxed_none(text: str) -> None:
    assert last_boxed(text) is None


# ---------------------------------------------------------------------------------- scoring


def test_is_a_registered_task() -> None:
    assert TASKS["math"] is MathTask
    task = make_task("math", format_reward=0.2)
    assert isinstance(task, Task) and task.name == "math" and task.format_reward == 0.2
    assert "\\boxed{}" in task.instructions and task.instructions == MATH_INSTRUCTIONS
    with pytest.raises(ValueError, match="format_reward"):
        MathTask(format_reward=1.0)
    with pytest.raises(ValueError, match="timeout_seconds"):
        MathTask(timeout_seconds=0)


@pytest.mark.parametrize(
    ("reference", "response", "reward"),
    [
        (r"\frac{1}{2}", r"So the answer is $\boxed{0.5}$.", 1.0),
        (r"\frac{1}{2}", r"$\boxed{1/2}$", 1.0),
        (r"\frac{1}{2}", r"$\boxed{\dfrac{1}{2}}$", 1.0),
        (r"\frac12", r"$\boxed{\tfrac{1}{2}}$", 1.0),
        ("0.5", r"$\boxed{\frac{1}{2}}$", 1.0),
        ("(1, 2)", r"$\boxed{\left( 1, 2 \right)}$", 1.0),
        ("[1, 3)", r"$\boxed{[1,3)}$", 1.0),
        (r"(-\infty, 2]", r"$\boxed{(-\infty,2]}$", 1.0),
        (r"\{1, 2\}", r"$\boxed{\{2, 1\}}$", 1.0),
        ("3", r"$\boxed{x = 3}$", 1.0),
        ("3", r"$\boxed{3\text{ cm}}$", 1.0),
        (r"\frac{\sqrt{2}}{2}", r"$\boxed{\sqrt{2}/2}$", 1.0),
        ("(x+1)^2", r"$\boxed{x^2+2x+1}$", 1.0),
        ("1000", r"$\boxed{1,000}$", 1.0),
        ("5", r"$\boxed 5$", 1.0),
        ("7", r"\fbox{7}", 1.0),
        (r"\frac{1}{2}", r"$\boxed{\frac{1}{3}}$", 0.1),  # boxed but wrong
        ("(1, 2)", r"$\boxed{[1, 2]}$", 0.1),  # open vs closed interval
        ("10", r"$\boxed{100}$", 0.1),
        (r"\pi", r"$\boxed{3.14}$", 0.1),
        ("3", r"first \boxed{3}, but finally \boxed{4}", 0.1),  # the last box is the answer
        ("4", r"first \boxed{3}, but finally \boxed{4}", 1.0),
        ("3", "The answer is 3.", 0.0),  # no box: no format reward
        ("3", r"#### 3", 0.0),
        ("3", r"\boxed{}", 0.0),
    ],
)
def test_score(task: MathTask, reference: str, response: str, reward: float) -> None:
    score = task.score(response, reference)
    assert score.reward == reward
    assert score.correct is (reward == 1.0)
    assert score.formatted is (reward > 0.0)
    assert (score.parsed is None) is (reward == 0.0)


def test_format_reward_is_the_option() -> None:
    assert MathTask(format_reward=0.0).score(r"\boxed{2}", "3").reward == 0.0
    assert MathTask(format_reward=0.25).score(r"\boxed{2}", "3").reward == 0.25


# ---------------------------------------------------------------------------------- timeout


def _hostile(task: MathTask) -> tuple[object, float]:
    started = time.monotonic()
    score = task.score(HOSTILE, "1")
    return score, time.monotonic() - started


@pytest.mark.timeout(120)  # fails, rather than hangs, without the bound
def test_a_hostile_answer_is_cut_off_and_scored_wrong(caplog: pytest.LogCaptureFixture) -> None:
    task = MathTask(timeout_seconds=BOUND_SECONDS)
    with caplog.at_level(logging.WARNING, logger="llmrl.envs.tasks.math"):
        score, seconds = _hostile(task)
    assert seconds < GENEROUS_WALL
    assert (score.reward, score.correct, score.formatted) == (0.1, False, True)
    assert "no verdict within 0.5 s" in caplog.text
    assert MathTask().score(r"\boxed{\frac{2}{4}}", "0.5").correct  # a fresh worker takes over


@pytest.mark.timeout(120)
def test_the_bound_holds_off_the_main_thread() -> None:
    """Env workers score in threads, where math-verify's SIGALRM timeout cannot work."""
    bounded, task = MathTask(timeout_seconds=BOUND_SECONDS), MathTask()
    results: dict[str, object] = {}

    def work(name: str, response: str, reference: str) -> None:
        started = time.monotonic()
        scorer = bounded if name == "hostile" else task  # the others: room for a loaded machine
        results[name] = (scorer.score(response, reference), time.monotonic() - started)

    jobs = [("hostile", HOSTILE, "1"), ("half", r"\boxed{0.5}", r"\frac{1}{2}")]
    jobs.append(("wrong", r"\boxed{x = 4}", "3"))
    # daemon threads: a broken bound fails the test without blocking the interpreter's exit
    threads = [threading.Thread(target=work, args=job, daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(GENEROUS_WALL * 2)
        assert not thread.is_alive()
    hostile, seconds = results["hostile"]
    assert seconds < GENEROUS_WALL and (hostile.reward, hostile.correct) == (0.1, False)
    assert results["half"][0].reward == 1.0
    assert results["wrong"][0].reward == 0.1


def test_a_worker_that_cannot_start_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a silent wrong answer: e.g. math-verify missing from the worker's interpreter."""
    monkeypatch.setattr(math_module, "_WORKER_CODE", "raise SystemExit(3)")
    with pytest.raises(RuntimeError, match=r"math-verify worker did not start .*exited with 3"):
        math_module._Pool().equivalent("1", "2", 5.0)


def test_without_math_verify_the_task_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = math_module.importlib.util.find_spec
    monkeypatch.setattr(
        math_module.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "math_verify" else real(name, *args),
    )
    with pytest.raises(ImportError, match="pip install 'math-verify"):
        MathTask()


# -------------------------------------------------------------------------------------- rows


def test_problem_from_a_math_row() -> None:
    problem = problem_from_row(ROWS[0], 3, "train")
    assert problem.id == "math-train-00003"
    assert problem.prompt == ROWS[0]["problem"]
    assert problem.answer == r"\frac{1}{2}"
    assert problem.sft_target == ROWS[0]["solution"]
    assert problem.meta == {"split": "train", "index": 3, "level": "Level 1", "type": "Prealgebra"}


def test_problem_from_an_answer_row() -> None:
    problem = problem_from_row(ROWS[3], 0, "eval")
    assert problem.answer == "(-1, 1)"
    assert problem.sft_target == r"The answer is $\boxed{(-1, 1)}$."
    assert problem.meta == {"split": "eval", "index": 0}
    # an answer field wins over the solution's box; a solution without a box gets one appended
    row = {"problem": "p", "solution": "It is four.", "answer": "$4$", "level": 5}
    problem = problem_from_row(row, 1, "train")
    assert problem.answer == "4" and problem.meta["level"] == "Level 5"
    assert problem.sft_target == "It is four.\n\nThe answer is $\\boxed{4}$."


@pytest.mark.parametrize(
    ("answer", "expected"),
    [("12", "12"), ("$12$", "12"), (r"\boxed{12}", "12"), (r" \dfrac{1}{2} ", r"\dfrac{1}{2}")],
)
def test_reference_from_answer_field(answer: str, expected: str) -> None:
    assert reference_answer({"answer": answer, "solution": r"\boxed{99}"}) == expected


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"solution": r"\boxed{1}"}, "MATH row 4 has no 'problem' field"),
        ({"problem": "p", "solution": "no box"}, "MATH row 4, field 'solution': no \\\\boxed"),
        ({"problem": "p"}, "MATH row 4, field 'solution': missing, and the row has no answer"),
        ({"problem": "p", "answer": "$ $"}, "MATH row 4, field 'answer': empty answer"),
        ({"problem": "p", "answer": ["1"]}, "MATH row 4, field 'answer': must be a string"),
        ({"problem": 7, "answer": "1"}, "MATH row 4, field 'problem': must be a non-empty"),
        ({"problem": "p", "answer": "1", "type": 3}, "MATH row 4, field 'type': must be"),
        ({"problem": "p", "answer": "1", "level": 2.5}, "MATH row 4, field 'level': expected"),
    ],
)
def test_row_errors_name_row_and_field(row: dict, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        problem_from_row(row, 4, "train")


# ------------------------------------------------------------------------------------- kinds


def test_kinds_are_level_and_type(task: MathTask) -> None:
    problems = [problem_from_row(row, i, "eval") for i, row in enumerate(ROWS)]
    assert [problem_kinds(task, p) for p in problems] == [
        ["level:Level 1", "type:Prealgebra"],
        ["level:Level 2", "type:Algebra"],
        ["level:Level 2", "type:Counting & Probability"],
        [],  # no level, no type
    ]
    table = accuracy_by_kind((problem_kinds(task, p), i != 1) for i, p in enumerate(problems))
    assert {kind: (c["correct"], c["total"]) for kind, c in table.items()} == {
        "level:Level 1": (1, 1),
        "level:Level 2": (1, 2),
        "type:Algebra": (0, 1),
        "type:Counting & Probability": (1, 1),
        "type:Prealgebra": (1, 1),
    }
    assert kind_metrics(table)["accuracy_by_kind/type:Counting _ Probability"] == 1.0
    assert kind_metrics(table)["accuracy_by_kind/level:Level 2"] == 0.5


# ----------------------------------------------------------------------------------- prepare


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_prepare_jsonl_with_the_cli(
    tmp_path: Path, task: MathTask, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _write_jsonl(tmp_path / "math.jsonl", ROWS)
    argv = ["prepare", "--set", "task=math", "--set", f"source={source}"]
    argv += ["--set", f"output_dir={tmp_path / 'out'}", "--set", "split.eval_fraction=0"]
    assert main(argv) == 0
    folder = Path(capsys.readouterr().out.strip().splitlines()[-1])
    train, eval_problems = load_prepared(folder)
    assert eval_problems == [] and [p.id for p in train] == [
        f"math-train-0000{i}" for i in (1, 2, 3, 4)
    ]
    assert [p.answer for p in train] == [r"\frac{1}{2}", "3", "6", "(-1, 1)"]
    assert train[2].meta == {
        "split": "train",
        "index": 3,
        "level": "Level 2",
        "type": "Counting & Probability",
    }
    assert problem_kinds(task, train[0]) == ["level:Level 1", "type:Prealgebra"]
    assert problem_kinds(task, train[3]) == []
    assert train[0] == problem_from_row(ROWS[0], 1, "train")  # the JSONL round trip loses nothing
    assert task.score(r"It is $\boxed{0.5}$.", train[0].answer).reward == 1.0
    assert task.score(r"$\boxed{(-1,1)}$", train[3].answer).reward == 1.0
    assert task.score(r"$\boxed{[-1,1]}$", train[3].answer).reward == 0.1


def test_prepare_parquet_with_renamed_columns_and_int_levels(
    tmp_path: Path, task: MathTask
) -> None:
    """MATH-500 shape: ``subject`` for ``type``, int levels, ``answer`` and ``solution``."""
    table = pa.table(
        {
            "problem": ["What is 1+1?", "What is 2+2?", "Name half."],
            "solution": ["It is $\\boxed{2}$.", "It is four.", None],
            "answer": [None, "4", "\\frac{1}{2}"],
            "subject": ["Prealgebra", "Prealgebra", "Algebra"],
            "level": [1, 2, 3],
        }
    )
    source = tmp_path / "math.parquet"
    pq.write_table(table, source)
    config = PrepareConfig(
        task="math",
        source=str(source),
        columns={"type": "subject"},
        split={"eval_fraction": 0},
        output_dir=tmp_path / "out",
    )
    train, _ = load_prepared(prepare_dataset(config, progress=False).path)
    assert [p.answer for p in train] == ["2", "4", r"\frac{1}{2}"]
    assert [problem_kinds(task, p) for p in train] == [
        ["level:Level 1", "type:Prealgebra"],
        ["level:Level 2", "type:Prealgebra"],
        ["level:Level 3", "type:Algebra"],
    ]
    assert train[1].sft_target == "It is four.\n\nThe answer is $\\boxed{4}$."
    assert task.score(r"\boxed{0.5}", train[2].answer).correct


@pytest.mark.parametrize(
    ("bad", "field", "problem"),
    [
        ({"problem": "Q?", "solution": "no boxed answer"}, "solution", "unparseable: no \\boxed"),
        ({"problem": "Q?"}, "solution", "unparseable: missing, and the row has no answer"),
        ({"solution": "\\boxed{1}"}, "problem", "missing (the row's fields: solution)"),
        ({"problem": "Q?", "answer": "1", "level": [1]}, "level", "unparseable: expected"),
    ],
)
def test_prepare_row_errors_name_file_row_and_field(
    tmp_path: Path, bad: dict, field: str, problem: str
) -> None:
    source = _write_jsonl(tmp_path / "rows.jsonl", [*ROWS[:2], bad])
    config = PrepareConfig(task="math", source=str(source), output_dir=tmp_path / "out")
    with pytest.raises(DatasetError) as excinfo:
        prepare_dataset(config, progress=False)
    assert (excinfo.value.row, excinfo.value.field) == (3, field)
    assert str(excinfo.value).startswith(f"{source}: row 3: field '{field}': {problem}")


def test_the_examples_hold() -> None:
    assert doctest.testmod(math_module).failed == 0
