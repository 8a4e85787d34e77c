"""Accuracy per problem kind: what a task calls a problem's kind, the per-kind tally, and the
MLflow metric names of those accuracies.

A task names a problem's kind with an optional method ``kind(problem) -> str | None`` (the
arithmetic task: the problem's operators, ``"+"`` or ``"+*"``); tasks without one, or problems it
returns None for, have no kind and are left out of the per-kind table. A task that groups its
problems in several ways instead defines ``kinds(problem) -> list[str]`` (the math task:
``["level:Level 3", "type:Algebra"]``), and each problem counts once in each of its kinds
(:func:`problem_kinds`).

MLflow metric names allow only alphanumerics, ``_``, ``-``, ``.``, `` ``, ``:`` and ``/``, so a
kind made of operator symbols is spelled out: ``"+"`` -> ``accuracy_by_kind/add``, ``"+*"`` ->
``accuracy_by_kind/add_mul``; other characters MLflow refuses become ``_``.

Example:
    >>> accuracy_by_kind([("+", True), ("+", False), ("*", True), (None, True)])
    {'*': {'correct': 1, 'total': 1, 'accuracy': 1.0}, '+': {'correct': 1, 'total': 2, \
'accuracy': 0.5}}
    >>> kind_metric_name("+*")
    'accuracy_by_kind/add_mul'
    >>> accuracy_by_kind([(["level:Level 1", "type:Algebra"], True), (["level:Level 1"], False)])
    {'level:Level 1': {'correct': 1, 'total': 2, 'accuracy': 0.5}, 'type:Algebra': {'correct': 1, \
'total': 1, 'accuracy': 1.0}}
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmrl.data.problem import Problem

KIND_METRIC_PREFIX = "accuracy_by_kind/"
"""Prefix of the per-kind accuracy metrics of an evaluation run."""
SYMBOL_NAMES = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
"""How operator symbols are spelled in metric names."""
_SYMBOLS_ONLY = re.compile(r"[+\-*/]+")
_NOT_IN_METRIC_NAMES = re.compile(r"[^\w.\- :/]")


def problem_kind(task: Any, problem: Problem) -> str | None:
    """The kind of ``problem``: ``task.kind(problem)`` when the task defines it, else None."""
    kind = getattr(task, "kind", None)
    return kind(problem) if callable(kind) else None


def problem_kinds(task: Any, problem: Problem) -> list[str]:
    """All the kinds of ``problem``: ``task.kinds(problem)`` when the task defines it, else
    ``[task.kind(problem)]``, else (no kind) an empty list."""
    kinds = getattr(task, "kinds", None)
    if callable(kinds):
        return list(kinds(problem))
    kind = problem_kind(task, problem)
    return [] if kind is None else [kind]


def accuracy_by_kind(
    results: Iterable[tuple[str | Sequence[str] | None, bool]],
) -> dict[str, dict[str, Any]]:
    """``{kind: {"correct": c, "total": n, "accuracy": c / n}}`` of ``(kind, correct)`` pairs,
    sorted by kind; results without a kind are left out. A result's kind may also be a list of
    kinds (:func:`problem_kinds`): it then counts once in each."""
    tally: dict[str, list[int]] = {}
    for kind, correct in results:
        for one in [] if kind is None else [kind] if isinstance(kind, str) else kind:
            counts = tally.setdefault(one, [0, 0])
            counts[0] += bool(correct)
            counts[1] += 1
    table = sorted(tally.items())
    return {kind: {"correct": c, "total": n, "accuracy": c / n} for kind, (c, n) in table}


def kind_metric_name(kind: str, prefix: str = KIND_METRIC_PREFIX) -> str:
    """The MLflow metric name of ``kind``'s accuracy (see the module docstring).

    Example:
        >>> kind_metric_name("-"), kind_metric_name("level 5")
        ('accuracy_by_kind/sub', 'accuracy_by_kind/level 5')
    """
    if _SYMBOLS_ONLY.fullmatch(kind):
        name = "_".join(SYMBOL_NAMES[symbol] for symbol in kind)
    else:
        name = _NOT_IN_METRIC_NAMES.sub("_", kind.strip()) or "_"
    return f"{prefix}{name}"


def kind_metrics(
    by_kind: Mapping[str, Mapping[str, Any]], prefix: str = KIND_METRIC_PREFIX
) -> dict[str, float]:
    """``{metric name: accuracy}`` of an :func:`accuracy_by_kind` table.

    Raises:
        ValueError: two kinds get the same metric name (one would hide the other).
    """
    metrics: dict[str, float] = {}
    owners: dict[str, str] = {}
    for kind, counts in by_kind.items():
        name = kind_metric_name(kind, prefix)
        if name in owners:
            raise ValueError(f"kinds {owners[name]!r} and {kind!r} both become metric {name!r}")
        owners[name] = kind
        metrics[name] = float(counts["accuracy"])
    return metrics
