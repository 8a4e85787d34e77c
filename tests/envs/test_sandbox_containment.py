"""The Python sandbox: hostile snippets are contained, the caller survives and keeps serving.

The table below is the heart of it: one row per hostile program, each with the containment
it must meet. Every row also checks that the caller is alive, the run stayed within its time
budget, its working directory is gone and no sandbox process is left behind.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmrl.envs import _sandbox_guard as guard
from llmrl.envs.sandbox import SandboxLimits, SandboxResult, run_python
from tests.support.hostile_programs import PROGRAMS, fill
from tests.support.sandbox_checks import (
    FAST,
    MARKER_ROOM,
    RECORDED_WORKDIRS,
    ROOMY,
    SECRET_NAME,
    SECRET_VALUE,
    sandbox_processes,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("secret_in_parent_env")]


@dataclass(frozen=True)
class Ctx:
    """What a row's code and checks may refer to (``@PORT@``, ``@ESCAPE@``, ``@SECRET@``).

    Programs the env suite also runs come from ``tests/support/hostile_programs.py``."""

    listener: socket.socket
    escape: Path  # outside the sandbox: must never be created

    def fill(self, code: str) -> str:
        port = self.listener.getsockname()[1]
        return fill(code, port=port, escape=self.escape, secret=SECRET_NAME)


@dataclass(frozen=True)
class Row:
    id: str
    code: str
    blocked: str | None = None  # the first operation the guard must report as denied
    error: str | None = None  # text that must appear in stderr
    timed_out: bool = False
    ok: bool = False  # whether the snippet itself may succeed
    limits: SandboxLimits = ROOMY
    after: Callable[[SandboxResult, Ctx], None] | None = None  # the specific containment


def nothing_connected(result: SandboxResult, ctx: Ctx) -> None:
    with pytest.raises(TimeoutError):
        ctx.listener.accept()


def no_passwd(result: SandboxResult, ctx: Ctx) -> None:
    assert "root:" not in result.stdout + result.stderr


def no_secret(result: SandboxResult, ctx: Ctx) -> None:
    assert SECRET_VALUE not in result.stdout + result.stderr


def no_escape_file(result: SandboxResult, ctx: Ctx) -> None:
    assert not ctx.escape.exists()


def output_capped(result: SandboxResult, ctx: Ctx) -> None:
    assert result.truncated
    assert len(result.stdout) <= ROOMY.max_output_chars + MARKER_ROOM
    assert len(result.stderr) <= ROOMY.max_output_chars + MARKER_ROOM


def parent_limits_intact(result: SandboxResult, ctx: Ctx) -> None:
    import resource

    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 64
    with open(__file__, "rb"):
        pass


HOSTILE = [
    Row("infinite-loop", PROGRAMS["infinite-loop"], timed_out=True, limits=FAST),
    Row("fork-bomb", PROGRAMS["fork-bomb"], "os.fork", "PermissionError"),
    Row("fork-then-sleep", "import os, time\nif os.fork() == 0:\n    time.sleep(60)", "os.fork"),
    Row("subprocess-run", "import subprocess\nsubprocess.run(['ls'])", "subprocess.Popen"),
    Row(
        "os-system",
        "import os\nos.system('echo hi')",
        "os.system",
        after=lambda r, c: assert_not_in("hi", r.stdout),
    ),
    Row("posix-spawn", "import os\nos.posix_spawn('/bin/true', ['true'], {})", "os.posix_spawn"),
    Row(
        "multiprocessing-spawn",  # goes straight to _posixsubprocess.fork_exec, no audit event
        "import multiprocessing as mp\nmp.set_start_method('spawn')\n"
        "mp.Process(target=print).start()",
        "_posixsubprocess.fork_exec",
    ),
    Row(
        "exec-a-shell",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'cat /etc/passwd'])",
        "os.exec",
        after=no_passwd,
    ),
    Row("memory-bomb", PROGRAMS["memory-bomb"], error="MemoryError"),
    Row("growing-list", PROGRAMS["growing-list"], error="MemoryError"),
    Row("huge-print", PROGRAMS["huge-print"], after=output_capped),
    Row("print-loop", PROGRAMS["print-loop"], after=output_capped),
    Row(
        "socket-connect",
        PROGRAMS["socket-connect"],
        "socket.__new__",
        after=nothing_connected,
    ),
    Row(
        "urlopen",
        PROGRAMS["urlopen"],
        "urllib.Request",
        after=nothing_connected,
    ),
    Row("read-etc-passwd", PROGRAMS["read-etc-passwd"], "open", after=no_passwd),
    Row(
        "read-parent-environ",
        PROGRAMS["read-parent-environ"],
        "open",
        after=no_secret,
    ),
    Row(
        "write-outside",
        PROGRAMS["write-outside"],
        "open",
        after=no_escape_file,
    ),
    Row(
        "kill-parent",
        PROGRAMS["kill-parent"],
        "os.kill",
        after=lambda r, c: os.kill(os.getpid(), 0),
    ),
    Row("killpg-own-group", "import os\nos.killpg(0, 9)", "os.killpg"),
    Row(
        "prlimit-parent",
        PROGRAMS["prlimit-parent"],
        "resource.prlimit",
        after=parent_limits_intact,
    ),
    Row(
        "raise-own-rlimit",
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
        error="ValueError",
    ),
    Row("import-ctypes", PROGRAMS["import-ctypes"], "import", "ImportError"),
    Row(
        "load-ctypes-behind-import",
        PROGRAMS["load-ctypes-behind-import"],
        error="ImportError",
    ),
    Row("chdir-root", "import os\nos.chdir('/')\nprint(open('etc/passwd').read())", "os.chdir"),
    Row("dotdot-escape", "print(open('../../../../../etc/passwd').read())", "open"),
    Row(
        "dir-fd-escape",
        "import os\nroot = os.open('/', os.O_RDONLY)\n"
        "print(os.read(os.open('etc/passwd', os.O_RDONLY, dir_fd=root), 100))",
        "open",
    ),
    Row(
        "symlink-escape",
        "import os\nos.symlink('/etc/passwd', 'p')\nprint(open('p').read())",
        "os.symlink",
    ),
    Row(
        "str-subclass-path",
        "class P(str):\n    def startswith(self, *a):\n        return True\n"
        "print(open(P('/etc/passwd')).read())",
        "open",
        after=no_passwd,
    ),
    Row(
        "fspath-flip",  # a path object that answers differently to the hook and to open(2)
        "import os, pathlib, posix\nn = [0]\n"
        "def flip(self):\n    n[0] += 1\n    return '/etc/passwd' if n[0] % 2 else 'main.py'\n"
        "pathlib.PurePath.__fspath__ = flip\n"
        "print(os.read(posix.open(pathlib.Path('x'), os.O_RDONLY), 100))",
        "open",
        after=no_passwd,
    ),
    Row("list-root", "import os\nprint(os.listdir('/'))", "os.listdir"),
    Row(
        "sqlite-uri",
        "import sqlite3\nsqlite3.connect('file:@ESCAPE@?mode=rwc', uri=True)",
        "sqlite3.connect",
        after=no_escape_file,
    ),
    Row(
        "audit-hook-tricks",
        "import sys\n"
        "exec(compile('import sys\\nsys.addaudithook(lambda *a: None)', 'x', 'exec'))\n"
        "for attempt in ('import gc; gc.get_objects()', 'sys.settrace(lambda *a: None)',\n"
        "                'sys.setprofile(lambda *a: None)', 'import _xxsubinterpreters'):\n"
        "    try:\n"
        "        exec(compile(attempt, 'x', 'exec'))\n"
        "    except (PermissionError, ImportError) as e:\n"
        "        print('denied:', e)\n"
        "try:\n"
        "    open('/etc/passwd')\n"
        "except PermissionError as e:\n"  # the hook's own frame must not help either
        "    tb = e.__traceback__\n"
        "    while tb.tb_next:\n"
        "        tb = tb.tb_next\n"
        "    tb.tb_frame.f_locals.update(deny=frozenset(), readable=('/',))\n"
        "print(open('/etc/passwd').read())",
        "gc.get_objects",
        after=no_passwd,
    ),
    Row(
        "signal-shenanigans",
        PROGRAMS["signal-shenanigans"],
        timed_out=True,
        limits=FAST,
    ),
    Row(
        "deep-recursion",  # C-level recursion past the stack: SIGSEGV, the caller is fine
        PROGRAMS["deep-recursion"],
    ),
    Row(
        "secret-env",
        PROGRAMS["secret-env"],
        ok=True,
        after=lambda r, c: (no_secret(r, c), assert_in("absent", r.stdout)),
    ),
    Row(
        "read-own-file",
        "print(open(__file__).read())",
        ok=True,
        after=lambda r, c: assert_in("open(__file__)", r.stdout),
    ),
]


def assert_in(needle: str, haystack: str) -> None:
    assert needle in haystack


def assert_not_in(needle: str, haystack: str) -> None:
    assert needle not in haystack


@pytest.fixture
def ctx():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.3)
        escape = Path(tempfile.gettempdir()) / f"llmrl_sandbox_escape_{uuid.uuid4().hex}"
        yield Ctx(listener, escape)
        escape.unlink(missing_ok=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("row", HOSTILE, ids=[row.id for row in HOSTILE])
def test_hostile_snippet_is_contained(row: Row, ctx: Ctx, workdirs: list[str]) -> None:
    result = run_python(ctx.fill(row.code), row.limits)

    os.kill(os.getpid(), 0)  # the caller (this pytest process) is alive
    assert result.duration_s < row.limits.timeout_s + 3
    assert result.timed_out == row.timed_out, result
    assert result.ok == row.ok, result
    if row.timed_out:
        assert result.exit_code is None
    if row.blocked is not None:
        assert result.blocked == row.blocked, result
        assert guard.MARKER not in result.stderr  # markers are parsed out, not shown
    if row.error is not None:
        assert row.error in result.stderr, result
    assert len(result.stdout) <= row.limits.max_output_chars + MARKER_ROOM
    if row.after is not None:
        row.after(result, ctx)
    assert workdirs and not any(os.path.exists(d) for d in workdirs)
    assert sandbox_processes(workdirs) == []


@pytest.mark.timeout(60)
def test_sandbox_still_serves_after_the_hostile_table(workdirs: list[str]) -> None:
    result = run_python("print(1 + 1)")
    assert result.ok and result.stdout == "2\n" and result.blocked is None
    assert RECORDED_WORKDIRS and sandbox_processes(RECORDED_WORKDIRS) == []
