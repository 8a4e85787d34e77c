"""A stage's result as a file: what ``llmrl prepare|sft|grpo|eval`` hands back to whoever ran it.

A launcher names a file in :data:`RESULT_FILE_ENV`; the command writes its summary there as one
JSON object once it has succeeded (``prepare``: ``{"path": <dataset directory>}``; the others:
the stage's summary), atomically: a reader sees the whole object or no file. The command still
prints the same summary as its last line of stdout, for people; programs read the file.

Example (the stage writes at its end, the launcher reads):

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "results" / "eval.json"
>>> write_result({"accuracy": 0.5}, path) == path
True
>>> read_result(path)
{'accuracy': 0.5}
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmrl.core.atomic_files import write_text_atomic

RESULT_FILE_ENV = "LLMRL_RESULT_FILE"
"""The environment variable naming the file a stage writes its result to (unset: none)."""


class ResultFileError(ValueError):
    """A result file that is missing or is not one JSON object; the message names the file."""


def result_path_from_env() -> Path | None:
    """The result file :data:`RESULT_FILE_ENV` names, or None when it is unset or empty."""
    value = os.environ.get(RESULT_FILE_ENV)
    return Path(value) if value else None


def write_result(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``summary`` to ``path`` as one JSON object, atomically (a temporary file in the
    same folder, flushed to disk, then renamed over ``path``); creates the folder. Values JSON
    cannot hold are written as their ``str``."""
    return write_text_atomic(path, json.dumps(dict(summary), default=str))


def read_result(path: str | Path) -> dict[str, Any]:
    """The JSON object in the result file ``path``.

    Raises:
        ResultFileError: the file is missing or unreadable, or holds something other than one
            JSON object (the message names the file and what is wrong).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultFileError(f"result file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ResultFileError(f"result file {path} cannot be read: {error}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        shown = text[:200] + ("..." if len(text) > 200 else "")
        raise ResultFileError(f"result file {path} is not JSON ({error}): {shown!r}") from None
    if not isinstance(value, dict):
        kind = type(value).__name__
        raise ResultFileError(f"result file {path} holds a {kind}, not a JSON object")
    return value
