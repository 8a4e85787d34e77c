"""Hostile programs through the env's Python tool: ``ChatEnv`` + ``PythonInterpreter``, end to end.

Each row is a reply whose ```python block is hostile, stepped in a batch next to a benign
reply. Every row must meet the same contract, whatever the program did:

* the step returns, and the hostile row's tool message tells the model what happened (the
  row's expected texts: the error, ``[timed out ...]``, ``[blocked: ...]``), bounded in size;
* the benign row of the same step answers correctly, and so does a following benign turn of
  the hostile conversation (the env keeps working);
* no process the program started survives (new descendants of this process, or any process
  whose command line carries the run's marker or working directory), and the env reaped its
  children (no zombie descendants);
* nothing is written outside the sandbox, its working directories are gone, nothing
  connected to the test's listening socket;
* neither the secret environment variable's value nor the outside file's secret appears in
  the conversation;
* this process received no signal, and its resource limits and descriptor count are unchanged.

``tests/envs/test_sandbox_containment.py`` checks ``run_python``'s own results on the shared
programs of ``tests/support/hostile_programs.py``; this module checks what the env and its caller
see.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmrl.envs import ChatEnv, PythonInterpreter, queries
from llmrl.envs.sandbox import SandboxLimits, sandbox_support
from tests.reliability.containment import (
    ProcessState,
    leftover_processes,
    sandbox_workdirs,
    signals_received,
)
from tests.support.hostile_programs import PROGRAMS, fill
from tests.support.scripted import ScriptedPolicy

pytestmark = pytest.mark.timeout(120)

SECRET_NAME, SECRET_VALUE = "LLMRL_TEST_SECRET", "hunter2-" + uuid.uuid4().hex
OUTSIDE_SECRET = "outside-secret-" + uuid.uuid4().hex
MARKER = "llmrl-hostile-" + uuid.uuid4().hex
STDERR_TAIL, NOTES_ROOM = 1500, 200  # SandboxResult.as_message's stderr tail, its notes

FAST = SandboxLimits(timeout_s=2)  # rows that must time out
ROOMY = SandboxLimits(timeout_s=20)  # the others end at once; room for a loaded machine
FORKING = SandboxLimits(timeout_s=20, max_processes=4)  # a tool that lets snippets fork
FORKING_FAST = SandboxLimits(timeout_s=2, max_processes=4)

TIMED_OUT = "[timed out after "
DENIED_EVERY_WAY = "\n".join(
    f"{way} denied PermissionError"
    for way in ("open", "os.open", "pathlib", "rename", "copy", "mkdir", "sqlite", "dotdot")
)


@dataclass(frozen=True)
class Row:
    """A hostile program of ``PROGRAMS`` and the texts its tool message must contain."""

    program: str
    expect: tuple[str, ...]
    limits: SandboxLimits = ROOMY

    @property
    def id(self) -> str:
        return self.program + ("-forking" if self.limits.max_processes else "")


def blocked(event: str, what: str = "") -> tuple[str, ...]:
    """The texts of a denial by the sandbox's guard: the exception and the note."""
    error = "ImportError" if event == "import" else "PermissionError"
    return (
        f"{error}: sandbox: {event}{what} is not allowed",
        "[exit code 1]",
        f"[blocked: {event}]",
    )


ROWS = [
    Row("infinite-loop", (TIMED_OUT,), FAST),
    Row("signal-shenanigans", (TIMED_OUT,), FAST),
    Row("fork-bomb", blocked("os.fork")),
    Row("zombie-children", blocked("os.fork")),
    Row("daemonize", blocked("os.fork")),
    Row("subprocess-with-marker", blocked("subprocess.Popen")),
    Row("memory-bomb", ("MemoryError", "[exit code 1]")),
    Row("growing-list", ("MemoryError", "[exit code 1]")),
    Row("thread-bomb", ("RuntimeError: can't start new thread", "[exit code 1]")),
    Row("huge-print", ("OSError: [Errno 27] File too large", "[output truncated]")),
    Row("print-loop", ("spam spam", "[output truncated]")),
    Row("disk-bomb", ("OSError: [Errno 27] File too large", "[exit code 1]")),
    Row("fd-exhaustion", ("OSError: [Errno 24] Too many open files", "[exit code 1]")),
    Row("socket-connect", blocked("socket.__new__")),
    Row("urlopen", blocked("urllib.Request")),
    Row("read-etc-passwd", blocked("open", " '/etc/passwd'")),
    Row("read-outside-file", blocked("open", " '@OUTSIDE@'")),
    Row("read-outside-file-dotdot", ("[blocked: open]",)),
    Row("read-parent-environ", ("[blocked: open]",)),
    Row("write-outside", blocked("open", " '@ESCAPE@'")),
    Row("write-outside-every-way", (DENIED_EVERY_WAY + "\n[blocked: open]",)),
    Row("secret-env", ("absent\n['HOME', 'LANG', ",)),
    Row("kill-parent", blocked("os.kill")),
    Row(
        "signal-parent-every-way",
        (
            "kill denied PermissionError\nkillpg denied PermissionError\n"
            "pidfd denied PermissionError\n",
            *blocked("os.kill"),
        ),
    ),
    Row("prlimit-parent", blocked("resource.prlimit")),
    Row("import-ctypes", blocked("import", " 'ctypes'")),
    Row("ctypes-kill-parent", blocked("import", " 'ctypes'")),
    Row("load-ctypes-behind-import", ("ImportError: sandbox: import '_ctypes' is not allowed",)),
    Row("deep-recursion", ("[killed by signal SIGSEGV]",)),
    Row("deep-python-recursion", ("RecursionError: maximum recursion depth exceeded",)),
    # A tool configured to let snippets start processes: whatever they start dies with the run.
    Row("subprocess-with-marker", ("started ",), FORKING),
    Row("zombie-children", ("zombies made\n" + TIMED_OUT,), FORKING_FAST),
    Row("daemonize", ("setsid denied 1\ndaemon started",), FORKING),
]


@dataclass(frozen=True)
class Targets:
    """What the hostile programs aim at, all owned by this test."""

    listener: socket.socket
    outside_dir: Path  # holds the outside secret; nothing else may appear in it
    escape: Path  # outside the sandbox, in the shared temp dir: must never be created

    @property
    def outside_file(self) -> Path:
        return self.outside_dir / "secret.txt"

    def fill(self, text: str) -> str:
        return fill(
            text,
            port=self.listener.getsockname()[1],
            escape=self.escape,
            outside=self.outside_file,
            secret=SECRET_NAME,
            marker=MARKER,
        )


@pytest.fixture(scope="module", autouse=True)
def warm_env() -> None:
    """Probe the sandbox (once per process) and step the env once before any baseline is
    taken, so lazily opened files and imports do not count as leaks of the first row."""
    sandbox_support()
    env = ChatEnv(transforms=[PythonInterpreter(ROOMY)])
    transition = env.step(ScriptedPolicy([python_reply("print(1)")])(env.reset(queries(["a"]))))
    assert tool_messages(transition)[0]["content"] == "1"


@pytest.fixture
def targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Targets]:
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        found = Targets(listener, tmp_path, Path(tempfile.gettempdir()) / f"{MARKER}-escape")
        found.outside_file.write_text(OUTSIDE_SECRET)
        yield found
        found.escape.unlink(missing_ok=True)


def python_reply(code: str) -> str:
    return f"Let me run this.\n```python\n{code}\n```"


def tool_messages(transition) -> list[dict]:
    return [chat[-1] for chat in transition["next", "history"].prompt.to_chats()]


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_hostile_program_through_the_env(row: Row, targets: Targets) -> None:
    env = ChatEnv(max_turns=3, transforms=[PythonInterpreter(row.limits)])
    state = env.reset(queries(["Solve it with Python.", "What is 1 + 1?"]))
    policy = ScriptedPolicy(
        [python_reply(targets.fill(PROGRAMS[row.program])), python_reply("print(1 + 1)")]
    )
    before = ProcessState.now()
    with signals_received() as signals, sandbox_workdirs() as workdirs:
        transition = env.step(policy(state))
        hostile, benign = tool_messages(transition)
        follow_up = env.step(ScriptedPolicy([python_reply("print(6 * 7)")])(transition["next"][:1]))
        (after_message,) = tool_messages(follow_up)
        survivors = leftover_processes(before, [MARKER, *workdirs])
    after = ProcessState.now()

    # The step returned a tool reply for both rows; the hostile one says what happened.
    assert transition["tool_called"].tolist() == [True, True]
    assert transition["done"].tolist() == [False, False]
    assert (hostile["role"], benign["role"]) == ("tool", "tool")
    for text in row.expect:
        assert targets.fill(text) in hostile["content"], hostile["content"]
    assert len(hostile["content"]) <= row.limits.max_output_chars + STDERR_TAIL + NOTES_ROOM
    # The env keeps working: the benign row beside it and the next turn of the same chat.
    assert benign["content"] == "2"
    assert (after_message["role"], after_message["content"]) == ("tool", "42")
    assert follow_up["tool_called"].tolist() == [True]
    # Nothing survives, leaks or escapes.
    assert survivors == []
    assert len(workdirs) == 3 and not any(os.path.exists(d) for d in workdirs)
    assert not targets.escape.exists()
    assert sorted(p.name for p in targets.outside_dir.iterdir()) == ["secret.txt"]
    assert targets.outside_file.read_text() == OUTSIDE_SECRET
    with pytest.raises(BlockingIOError):
        targets.listener.accept()
    everything = str(follow_up["next", "history"].prompt.to_chats())
    assert SECRET_VALUE not in everything and OUTSIDE_SECRET not in everything
    assert signals == []
    assert after.limits == before.limits
    assert after.fds == before.fds


def test_a_reply_of_many_endless_loops_runs_at_most_max_blocks() -> None:
    loops = "\n".join(python_reply("while True:\n    pass") for _ in range(40))
    env = ChatEnv(max_turns=2, transforms=[PythonInterpreter(FAST, max_blocks=2)])
    state = env.reset(queries(["Loop."]))
    with sandbox_workdirs() as workdirs:
        (message,) = tool_messages(env.step(ScriptedPolicy([loops])(state)))
    parts = message["content"].split("\n\n")
    assert len(parts) == 3 and all(part.startswith(TIMED_OUT) for part in parts[:2])
    assert parts[2] == "[38 more python blocks not run: at most 2 per reply]"
    assert len(workdirs) == 2


@pytest.mark.parametrize("max_blocks", [0, -1, 1.5, True])
def test_max_blocks_is_validated(max_blocks) -> None:
    with pytest.raises(ValueError, match="max_blocks must be an integer >= 1"):
        PythonInterpreter(max_blocks=max_blocks)


def test_the_probes_see_what_they_look_for() -> None:
    """Each containment probe reports a planted violation, so the table above can fail."""
    before = ProcessState.now()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", MARKER])
    try:
        (found,) = leftover_processes(before, [MARKER], grace_s=0.2)
        assert found.startswith(f"{sleeper.pid} (") and found.endswith(f"time.sleep(60) {MARKER}")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert leftover_processes(before, [MARKER], grace_s=0.2) == []
    with signals_received() as received:
        os.kill(os.getpid(), signal.SIGUSR1)
    assert received == [signal.SIGUSR1]
    with sandbox_workdirs() as workdirs:
        path = tempfile.mkdtemp(prefix="llmrl-sandbox-")
        os.rmdir(path)
    assert workdirs == [path]
