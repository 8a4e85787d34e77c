"""What the sandbox tests of ``tests/envs`` share: their limits, the secret the caller's
environment holds while they run, and a look for sandbox processes left behind."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from llmrl.envs import _sandbox_guard as guard
from llmrl.envs.sandbox import SandboxLimits

FAST = SandboxLimits(timeout_s=1)  # for the rows that must time out
ROOMY = SandboxLimits(timeout_s=5)  # the others finish at once; room for a loaded machine
SECRET_NAME, SECRET_VALUE = "LLMRL_TEST_SECRET", "hunter2-" + uuid.uuid4().hex
MARKER_ROOM = 64  # what the brief allows on top of max_output_chars

RECORDED_WORKDIRS: list[str] = []  # every sandbox directory the `workdirs` fixture saw


def sandbox_processes(workdirs: list[str]) -> list[str]:
    """Live sandbox interpreters of this test: their command line carries the guard's bootstrap
    and their environment (fixed at exec, whatever the snippet does) names one of ``workdirs``.
    Sandboxes of tests running at the same time in other pytest workers are not counted."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        ours = any(f"\0HOME={workdir}\0".encode() in b"\0" + environ for workdir in workdirs)
        if guard.BOOTSTRAP.encode() in cmdline and state != "Z" and ours:
            found.append(f"{pid}: {cmdline[:80]!r}")
    return found
