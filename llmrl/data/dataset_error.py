"""The errors dataset readers raise: bad data (file, row and field named), or a missing package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmrl.core.config_loading import quoted

MAX_PROBLEM_CHARS = 1000
"""A :class:`DatasetError`'s problem text is cut to this many characters."""


class DatasetError(ValueError):
    """Bad data: the message reads ``<file>: row <n>: field '<name>': <problem>``.

    ``file``, ``row``, ``line`` and ``field`` hold the parts (None where they do not apply; a
    syntax error has a ``line``, a bad value a ``row``); ``reason`` is a short category
    (``missing_field``, ``wrong_type``, ...) used to count skipped rows.

    Example:
        >>> str(DatasetError("expected a string, got int", file="a.jsonl", row=17, field="answer"))
        "a.jsonl: row 17: field 'answer': expected a string, got int"
    """

    def __init__(
        self,
        problem: str,
        *,
        file: str | Path | None = None,
        row: int | None = None,
        line: int | None = None,
        field: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.problem = quoted(problem, MAX_PROBLEM_CHARS)
        self.file = None if file is None else str(file)
        self.row = row
        self.line = line
        self.field = None if field is None else quoted(field)
        self.reason = reason
        parts = [part for part in (self.file,) if part]
        if row is not None:
            parts.append(f"row {row}")
        if line is not None:
            parts.append(f"line {line}")
        if field is not None:
            parts.append(f"field '{self.field}'")
        super().__init__(": ".join([*parts, self.problem]))

    def __reduce__(self) -> tuple:
        kwargs = {
            "file": self.file,
            "row": self.row,
            "line": self.line,
            "field": self.field,
            "reason": self.reason,
        }
        return (_rebuild_dataset_error, (self.problem, kwargs))


def _rebuild_dataset_error(problem: str, kwargs: dict[str, Any]) -> DatasetError:
    return DatasetError(problem, **kwargs)


class MissingDatasetsError(ImportError):
    """Reading a ``datasets`` directory or a hub id needs the ``datasets`` package."""

    def __init__(self, source: str) -> None:
        super().__init__(
            f"reading {source} (a datasets directory or hub id) needs the 'datasets' package, "
            "which is not installed. Install it with: pip install datasets"
        )
        self.source = source

    def __reduce__(self) -> tuple:
        return (type(self), (self.source,))
