"""The bad-input corpus's rows and how each is checked: a user mistake that must fail cleanly.

Each row writes its input files into an empty working directory, runs one command (the real
``llmrl`` CLI in process, a few as a real ``python -m llmrl.cli`` subprocess, or a library API)
and :func:`assert_fails_cleanly` checks three things:

- it fails: exit code 2 for the CLI (a user error, no traceback), the row's exception for an API;
- the message holds every expected substring: the field, the file and, for data, the row/line;
- it leaves nothing behind: the working directory holds exactly the files the row wrote, with
  the same bytes (no output file, no temporary file, no half-written dataset or checkpoint).

The rows: tests/reliability/bad_input_data.py (datasets), bad_input_settings.py (configs,
topologies, generation kwargs, chart values, CLI flags), test_bad_input_models.py (model folders).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llmrl.cli import main
from tests.support.paths import REPO

PREPARED = object()
"""A file value: copy the module's prepared arithmetic dataset folder here."""
Content = str | bytes | Callable[[Path], bytes] | object
"""A file's text, bytes, a function of the prepared dataset's folder that returns its bytes, or
:data:`PREPARED`."""


@dataclass(frozen=True)
class Api:
    """A library call that must raise ``error``; ``call`` gets a fixture getter."""

    call: Callable[[Callable[[str], Any]], object]
    error: type[BaseException]


@dataclass(frozen=True)
class Row:
    """One bad input: the files to write, the command, the substrings its error must contain."""

    id: str
    files: Mapping[str, Content]
    command: list[str] | Api
    expect: tuple[str, ...]
    subprocess: bool = False
    marks: tuple[Any, ...] = field(default=())


def stage(name: str, *more: str) -> list[str]:
    """``llmrl <stage>`` on the prepared dataset copied to ``data/``, tracking off."""
    return [name, "--no-progress", "--set", "data.path=data", "--set", "tracking.enabled=false",
            *more]  # fmt: skip


ONE_LINE = {"config-lr-infinite", "config-lr-nan", "config-steps-1e30", "config-steps-huge-int"}
"""Rows whose error is one line naming the field (no second problem, no traceback)."""


def write_inputs(folder: Path, files: Mapping[str, Content], prepared: Path) -> None:
    for name, content in files.items():
        path = folder / name
        if content is PREPARED:
            shutil.copytree(prepared, path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content(prepared) if callable(content) else content
        path.write_bytes(data.encode() if isinstance(data, str) else data)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones included) by its sha256.

    Folders are left out: ``llmrl prepare`` creates its ``output_dir`` root before it reads a row
    and keeps it, empty, after a failure (tests/test_cli_prepare.py relies on that); any file in
    it, a temporary folder's included, shows up here.
    """
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if not path.is_dir()
    }


def run_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    return code, capsys.readouterr().err


def run_subprocess(argv: list[str], folder: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "llmrl.cli", *argv],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stderr


def assert_fails_cleanly(
    row: Row,
    work: Path,
    prepared_dataset: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run ``row`` in ``work`` (the empty cwd) and check it fails cleanly (the module's three
    checks; a one-line message for the rows of :data:`ONE_LINE`)."""
    write_inputs(work, row.files, prepared_dataset)
    before = snapshot(work)
    if isinstance(row.command, Api):
        with pytest.raises(row.command.error) as raised:
            row.command.call(request.getfixturevalue)
        message = str(raised.value)
    else:
        if row.subprocess:
            code, message = run_subprocess(row.command, work)
        else:
            code, message = run_in_process(row.command, capsys)
        assert code == 2, message
        assert "Traceback" not in message
    for expected in row.expect:
        assert expected in message, f"{expected!r} not in:\n{message}"
    assert len(message) < 5_000, "user input echoed at length"  # 50 MB rows included
    if row.id in ONE_LINE:
        assert message.strip().count("\n") == 0, message
    assert snapshot(work) == before, "the failed command left files behind or changed its input"
