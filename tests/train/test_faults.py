"""The fault-injection hook: ``LLMRL_FAULT_AT`` SIGKILLs the process at exactly the named hit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from llmrl.core.faults import FAULT_ENV, KILL_MESSAGE, fault_point, parse_fault

# Reaches generate at steps 1 and 2 (twice in step 2), printing what it survived.
_SCRIPT = """
from llmrl.core.faults import fault_point
for phase, step in [("generate", 1), ("generate", 2), ("backward", 2), ("generate", 2)]:
    fault_point(phase, step)
    print(phase, step, flush=True)
"""


def _run(spec: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if spec:
        env[FAULT_ENV] = spec
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("spec", "survived"),
    [
        ("generate:1", []),
        ("generate:2", ["generate 1"]),
        ("generate:2:2", ["generate 1", "generate 2", "backward 2"]),
        ("backward:2", ["generate 1", "generate 2"]),
    ],
)
def test_the_process_dies_at_the_named_hit(spec: str, survived: list[str]) -> None:
    result = _run(spec)
    assert result.returncode == -signal.SIGKILL
    assert result.stdout.splitlines() == survived
    assert result.stderr.strip() == f"{KILL_MESSAGE} {spec}"


@pytest.mark.parametrize("spec", [None, "generate:3", "generate:2:3", "log_metrics:1"])
def test_no_match_means_no_fault(spec: str | None) -> None:
    result = _run(spec)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 4


def test_unset_is_a_no_op_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAULT_ENV, raising=False)
    fault_point("generate", 1)  # returns: nothing named


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("generation:1", "expected <phase>:<step>"),
        ("generate", "expected <phase>:<step>"),
        ("generate:1:2:3", "expected <phase>:<step>"),
        ("generate:x", "must be integers"),
        ("generate:0", "at least 1"),
        ("generate:1:0", "at least 1"),
    ],
)
def test_malformed_specs_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fault(spec)


def test_a_spec_parses() -> None:
    assert parse_fault("checkpoint_write:4:2") == ("checkpoint_write", 4, 2)
    assert parse_fault("log_metrics:3") == ("log_metrics", 3, 1)
