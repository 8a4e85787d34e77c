"""Accuracy per problem kind: the tally, what a task calls a kind (the arithmetic operators) and
the MLflow metric names, which MLflow itself must accept."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

import llmrl.eval.kinds as kinds_module
from llmrl.data.problem import Problem
from llmrl.envs.tasks import ArithmeticTask, GSM8KTask, MathTask
from llmrl.envs.tasks.math import problem_from_row
from llmrl.eval.kinds import (
    accuracy_by_kind,
    kind_metric_name,
    kind_metrics,
    problem_kind,
    problem_kinds,
)


def test_accuracy_by_kind_by_hand() -> None:
    results = [("+", True), ("*", False), ("+", False), ("+", True), (None, True), ("*", False)]
    assert accuracy_by_kind(results) == {
        "*": {"correct": 0, "total": 2, "accuracy": 0.0},
        "+": {"correct": 2, "total": 3, "accuracy": pytest.approx(2 / 3)},  # one float64 division
    }  # sorted by kind; the result without a kind is left out
    assert accuracy_by_kind([(None, True)]) == {}


def _problem(*operators: str) -> Problem:
    return Problem("arithmetic-eval-0-0", "What is ...?", "0", meta={"operators": list(operators)})


@pytest.mark.parametrize(
    ("operators", "kind"),
    [
        (["+"], "+"),
        (["-"], "-"),
        (["*"], "*"),
        (["*", "+"], "+*"),  # each operator once, in the order "+-*"
        (["+", "*", "+"], "+*"),
        (["*", "-", "+"], "+-*"),
        ([], None),
    ],
)
def test_arithmetic_kind_is_its_operators(operators: list[str], kind: str | None) -> None:
    assert problem_kind(ArithmeticTask(), _problem(*operators)) == kind


def test_generated_problems_have_the_kind_of_their_expression() -> None:
    for problem in ArithmeticTask(num_operands=3).generate(20, seed=0, split="eval"):
        symbols = set(problem.meta["expression"].split()) & set("+-*")
        assert set(problem_kind(ArithmeticTask(), problem)) == symbols


def test_tasks_without_kinds_have_none() -> None:
    assert problem_kind(GSM8KTask(), _problem("+")) is None
    assert problem_kind(object(), _problem("+")) is None


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("+", "accuracy_by_kind/add"),
        ("-", "accuracy_by_kind/sub"),
        ("*", "accuracy_by_kind/mul"),
        ("+*", "accuracy_by_kind/add_mul"),
        ("+-*", "accuracy_by_kind/add_sub_mul"),
        ("level 5", "accuracy_by_kind/level 5"),
        ("Counting & Probability", "accuracy_by_kind/Counting _ Probability"),
        ("a+b", "accuracy_by_kind/a_b"),
        ("level:Level 3", "accuracy_by_kind/level:Level 3"),
        ("type:Counting & Probability", "accuracy_by_kind/type:Counting _ Probability"),
        ("level:Level ?", "accuracy_by_kind/level:Level _"),
    ],
)
def test_metric_names_spell_out_symbols_mlflow_refuses(kind: str, name: str) -> None:
    from mlflow.utils.validation import _validate_metric_name

    assert kind_metric_name(kind) == name
    _validate_metric_name(name)  # raises for a name MLflow refuses


def test_mlflow_refuses_the_raw_operators() -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_metric_name

    for symbol in "+*":
        with pytest.raises(MlflowException):
            _validate_metric_name(f"accuracy_by_kind/{symbol}")


def test_kind_metrics_and_name_collisions() -> None:
    table = accuracy_by_kind([("+", True), ("*", False), ("+", False)])
    assert kind_metrics(table) == {"accuracy_by_kind/mul": 0.0, "accuracy_by_kind/add": 0.5}
    with pytest.raises(ValueError, match="'a\\+b' and 'a\\*b' both become metric"):
        kind_metrics({"a+b": {"accuracy": 1.0}, "a*b": {"accuracy": 0.0}})


def test_a_result_with_several_kinds_counts_in_each() -> None:
    results = [(["level:1", "type:A"], True), (["level:1", "type:B"], False), ("type:A", False)]
    results += [([], True), (None, True)]  # no kind: left out
    assert accuracy_by_kind(results) == {
        "level:1": {"correct": 1, "total": 2, "accuracy": 0.5},
        "type:A": {"correct": 1, "total": 2, "accuracy": 0.5},
        "type:B": {"correct": 0, "total": 1, "accuracy": 0.0},
    }


def _math_problems() -> list[Problem]:
    rows = [
        {"problem": "a", "answer": "1", "level": "Level 1", "type": "Algebra"},
        {"problem": "b", "answer": "2", "level": "Level 3", "type": "Counting & Probability"},
        {"problem": "c", "answer": "3", "level": "Level 3", "type": "Algebra"},
        {"problem": "d", "answer": "4"},
    ]
    return [problem_from_row(row, i, "eval") for i, row in enumerate(rows)]


def test_problem_kinds() -> None:
    assert problem_kinds(ArithmeticTask(), _problem("*", "+")) == ["+*"]  # kind() as a list
    assert problem_kinds(GSM8KTask(), _problem("+")) == []
    assert problem_kinds(object(), _problem("+")) == []
    first, _, _, last = _math_problems()
    assert problem_kinds(MathTask(), first) == ["level:Level 1", "type:Algebra"]
    assert problem_kinds(MathTask(), last) == []
    assert problem_kind(MathTask(), first) is None  # a multi-kind task has no single kind


def test_evaluation_tallies_every_kind_of_a_multi_kind_task(tmp_path: Path) -> None:
    """The eval stage's summary (here without a model) has per-level and per-type accuracy."""
    from llmrl.config.evaluate import EvalConfig
    from llmrl.stages.evaluate import _summarise

    problems = _math_problems()
    greedy = {p.id: [(i != 1, "\\boxed{0}")] for i, p in enumerate(problems)}
    config = EvalConfig(data={"path": str(tmp_path)}, output_dir=str(tmp_path), label="m")
    report = _summarise(config, MathTask(), problems, greedy, {}, 1.0)
    assert report.accuracy_by_kind == {
        "level:Level 1": {"correct": 1, "total": 1, "accuracy": 1.0},
        "level:Level 3": {"correct": 1, "total": 2, "accuracy": 0.5},
        "type:Algebra": {"correct": 2, "total": 2, "accuracy": 1.0},
        "type:Counting & Probability": {"correct": 0, "total": 1, "accuracy": 0.0},
    }
    assert report.accuracy == 0.75  # the problem without kinds still counts overall
    metrics = report.as_metrics()
    assert metrics["accuracy_by_kind/level:Level 3"] == 0.5
    assert metrics["accuracy_by_kind/type:Counting _ Probability"] == 0.0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [row["kinds"] for row in rows] == [problem_kinds(MathTask(), p) for p in problems]
    assert all(row["kind"] is None for row in rows)


def test_the_examples_hold() -> None:
    assert doctest.testmod(kinds_module).failed == 0
