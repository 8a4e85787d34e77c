"""The ``llmrl`` console script, run as a real subprocess."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmrl.cli import main, one_line
from llmrl.models import resolve_spec
from llmrl.models.gguf_cache import converted_dir_for


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    script = shutil.which("llmrl", path=str(Path(sys.executable).parent))
    assert script, "the llmrl console script is not installed in this environment"
    return subprocess.run(
        [script, *args], capture_output=True, text=True, env=env or dict(os.environ), timeout=300
    )


def test_convert_model_prints_the_cache_directory(tokenizer):  # tokenizer: conversion done once
    result = _run("convert-model")
    assert result.returncode == 0, result.stderr
    printed = Path(result.stdout.strip())
    assert printed == converted_dir_for(resolve_spec("smollm2-135m-instruct").location)
    assert (printed / "model.safetensors").is_file()


def test_unknown_model_fails_with_a_clear_message():
    result = _run("convert-model", "no-such-model")
    assert result.returncode == 2
    assert "unknown model name 'no-such-model'" in result.stderr
    assert "smollm2-135m-instruct" in result.stderr


def test_missing_gguf_file_fails_naming_it(tmp_path):
    result = _run("convert-model", str(tmp_path / "absent.gguf"))
    assert result.returncode == 2
    assert f"model path {tmp_path / 'absent.gguf'} does not exist" in result.stderr


def test_version():
    result = _run("--version")
    assert result.returncode == 0 and result.stdout.startswith("llmrl ")


# Every failure: one escaped line on stderr, no traceback (unless --debug) ---------------------
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters other than tab and newline: none may reach the terminal raw."""
ESCAPES_YAML = '"\\e[2J\\e]0;pwned\\a\\r\\0key": 1\n'
"""A config key holding ESC (clear screen, set the title), BEL, CR and NUL."""

FAILURES = {
    "output-folder-is-a-file": (["prepare", "--set", "output_dir=taken"], 2,
                                "output_dir: taken is a file; name a folder"),
    "output-folder-under-a-file": (["prepare", "--set", "output_dir=taken/sub"], 2,
                                   "taken is a file (in the way of taken/sub)"),
    "escapes-in-a-config-key": (["prepare", "--config", "escapes.yaml"], 2,
                                r"unknown key '\x1b[2J\x1b]0;pwned\x07\r\x00key'"),
    "escapes-in-a-command": (["\x1b[31mtrain\x9b"], 2, r"invalid choice: '\x1b[31mtrain\x9b'"),
    "huge-integer": (["prepare", "--set", "seed=" + "9" * 5000], 2, "more] "),
    "huge-value": (["prepare", "--set", "task=" + "x" * 100_000], 2, "characters in all)"),
    "deep-nesting": (["prepare", "--config", "deep.yaml"], 2, "deep.yaml: "),
    "unwritable-output": (["prepare", "--set", "output_dir=/proc/llmrl-test"], 1,
                          "/proc/llmrl-test (run with --debug for the traceback)"),
}  # fmt: skip
IN_A_SUBPROCESS = ("escapes-in-a-config-key", "escapes-in-a-command", "unwritable-output")


def _inputs(folder: Path) -> list[str]:
    (folder / "taken").write_text("a file where a folder should be")
    (folder / "escapes.yaml").write_text(ESCAPES_YAML)
    (folder / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    return ["deep.yaml", "escapes.yaml", "taken"]


def _check_one_line(name: str, code: int, err: str) -> None:
    _, expected_code, expected = FAILURES[name]
    assert code == expected_code, (name, err)
    assert "Traceback" not in err and not RAW_CONTROL.search(err), (name, err)
    [line] = [line for line in err.splitlines() if " INFO " not in line]  # logging aside
    assert line.startswith("llmrl") and ": error: " in line, (name, err)
    assert expected in line, (name, line)
    assert len(line) < 2500, (name, len(line))


@pytest.mark.parametrize("name", FAILURES)
def test_each_failure_is_one_escaped_line(name, tmp_path, monkeypatch, capsys) -> None:
    files = _inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    try:
        code = main(FAILURES[name][0])
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    _check_one_line(name, code, capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == files, "nothing left behind"


def test_the_console_script_prints_one_escaped_line(tmp_path: Path) -> None:
    _inputs(tmp_path)
    script = shutil.which("llmrl", path=str(Path(sys.executable).parent))
    started = {  # all at once: each pays the import time
        name: subprocess.Popen([script, *FAILURES[name][0]], cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for name in IN_A_SUBPROCESS
    }  # fmt: skip
    for name, process in started.items():
        err = process.communicate(timeout=300)[1].decode()
        _check_one_line(name, process.returncode, err)


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    script = shutil.which("llmrl", path=str(Path(sys.executable).parent))
    done = subprocess.run([script, "prepare", "--debug", "--set", "output_dir=taken"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.splitlines()[-1].startswith("llmrl prepare: error: output_dir: taken")


def test_one_line_escapes_and_cuts() -> None:
    assert one_line("a\x1b[2Jb\r\x00\u202ec") == r"a\x1b[2Jb\r\x00\u202ec"
    assert one_line("first\n  second\n") == "first; second"
    assert one_line("k" * 300) == "k" * 200 + "...[100 more]"
    assert one_line("w " * 5000).endswith("more characters]")
