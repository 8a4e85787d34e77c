"""Checks of a source row's fields before a task turns the row into a problem.

Each function takes ``columns``, a map from task field to the source column that holds it, and
returns the values keyed by task field; the first problem raises a :class:`DatasetError` naming
the file, the row and the column, with a ``reason`` that ``llmrl prepare`` counts skipped rows by.
"""

from __future__ import annotations

from typing import Any

from llmrl.data.dataset_error import DatasetError


def require_text_fields(
    row: dict[str, Any],
    columns: dict[str, str],
    *,
    file: str,
    row_number: int,
    max_chars: int,
) -> dict[str, str]:
    """Check that ``row`` has non-blank string columns; returns them keyed by task field.

    ``columns`` maps each task field to the source column that holds it. The first problem
    raises a :class:`DatasetError` naming the column, with ``reason`` one of ``missing_field``,
    ``wrong_type``, ``empty`` or ``too_long``.

    Example:
        >>> require_text_fields({"q": "2+2?"}, {"question": "q"}, file="a", row_number=1,
        ...                     max_chars=100)
        {'question': '2+2?'}
    """
    values = {}
    for field, column in columns.items():
        if column in row:
            found = _text_problem(row[column], max_chars)
        else:
            found = (_missing(row), "missing_field")
        if found is not None:
            problem, reason = found
            if field != column:
                problem += f" (task field '{field}'; see `columns`)"
            raise DatasetError(problem, file=file, row=row_number, field=column, reason=reason)
        values[field] = row[column]
    return values


def require_fields(
    row: dict[str, Any], columns: dict[str, str], *, file: str, row_number: int
) -> dict[str, Any]:
    """The values of ``columns`` (task field -> source column) in ``row``, of any type.

    For structured fields (lists, objects) that the task itself checks; a missing column raises
    a :class:`DatasetError` (``reason`` ``missing_field``) naming it and the row's fields.
    """
    values = {}
    for field, column in columns.items():
        if column not in row:
            problem = _missing(row)
            if field != column:
                problem += f" (task field '{field}'; see `columns`)"
            raise DatasetError(
                problem, file=file, row=row_number, field=column, reason="missing_field"
            )
        values[field] = row[column]
    return values


def present_fields(
    row: dict[str, Any], columns: dict[str, str], *, file: str, row_number: int, max_chars: int
) -> dict[str, Any]:
    """The optional fields ``row`` has (absent or null ones left out), keyed by task field; the
    task checks their values. A text longer than ``max_chars`` is a ``too_long`` error."""
    present = {}
    for name, column in columns.items():
        value = row.get(column)
        if value is None:
            continue
        if isinstance(value, str) and len(value) > max_chars:
            problem = _too_long(value, max_chars)
            raise DatasetError(problem, file=file, row=row_number, field=column, reason="too_long")
        present[name] = value
    return present


def _missing(row: dict[str, Any]) -> str:
    present = ", ".join(sorted(map(str, row))[:20]) or "none"
    return f"missing (the row's fields: {present})"


def _too_long(value: str, max_chars: int) -> str:
    return f"{len(value)} characters, over the limit of {max_chars} (max_row_chars)"


def _text_problem(value: Any, max_chars: int) -> tuple[str, str] | None:
    """What is wrong with a text value, as (problem, reason), or None when it is fine."""
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        return f"expected a string, got {kind}", "wrong_type"
    if not value:
        return "empty string", "empty"
    if not value.strip():
        return "whitespace only", "empty"
    if len(value) > max_chars:
        return _too_long(value, max_chars), "too_long"
    return None
