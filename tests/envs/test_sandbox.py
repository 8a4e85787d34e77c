"""The Python sandbox: hostile snippets are contained, the caller survives and keeps serving.

The table below is the heart of it: one row per hostile program, each with the containment
it must meet. Every row also checks that the caller is alive, the run stayed within its time
budget, its working directory is gone and no sandbox process is left behind.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmrl.envs import _sandbox_guard as guard
from llmrl.envs import sandbox
from llmrl.envs.sandbox import (
    SandboxLimits,
    SandboxResult,
    extract_python_blocks,
    run_python,
    sandbox_support,
)
from tests.support.hostile_programs import PROGRAMS, fill

pytestmark = pytest.mark.timeout(60)

FAST = SandboxLimits(timeout_s=1)  # for the rows that must time out
ROOMY = SandboxLimits(timeout_s=5)  # the others finish at once; room for a loaded machine
SECRET_NAME, SECRET_VALUE = "LLMRL_TEST_SECRET", "hunter2-" + uuid.uuid4().hex
MARKER_ROOM = 64  # what the brief allows on top of max_output_chars


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


MODULE_WORKDIRS: list[str] = []  # every sandbox directory made by this module's tests


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


@pytest.fixture(autouse=True)
def secret_in_parent_env(monkeypatch):
    monkeypatch.setenv(SECRET_NAME, SECRET_VALUE)


@pytest.fixture
def workdirs(monkeypatch) -> list[str]:
    """Every temporary directory the sandbox creates during the test."""
    made: list[str] = []
    real = tempfile.mkdtemp

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        MODULE_WORKDIRS.append(made[-1])
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording)
    return made


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
    assert MODULE_WORKDIRS and sandbox_processes(MODULE_WORKDIRS) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            "import math\nprint(math.factorial(20), round(math.pi, 3))",
            "2432902008176640000 3.142\n",
        ),
        ("import json\nprint(json.dumps({'a': [1, 2]}, sort_keys=True))", '{"a": [1, 2]}\n'),
        (
            "with open('data.txt', 'w') as f:\n    f.write('hello')\n"
            "with open('data.txt') as f:\n    print(f.read())",
            "hello\n",
        ),
        (
            "import pathlib, shutil\nd = pathlib.Path('out/sub')\nd.mkdir(parents=True)\n"
            "(d / 'a.txt').write_text('x')\nprint([p.name for p in d.iterdir()])\n"
            "shutil.rmtree('out')\nprint(pathlib.Path('out').exists())",
            "['a.txt']\nFalse\n",
        ),
        (
            "import tempfile, os\nwith tempfile.TemporaryDirectory() as d:\n"
            "    print(d.startswith(os.getcwd()))",
            "True\n",
        ),
        (
            "import threading\nt = threading.Thread(target=print, args=('t',))\n"
            "t.start()\nt.join()",
            "t\n",
        ),
        ("print('héllo ✓')", "héllo ✓\n"),
        ("import sys\nprint(sys.argv, __name__)", "['main.py'] __main__\n"),
    ],
)
def test_normal_code_runs(code: str, expected: str) -> None:
    result = run_python(code, SandboxLimits(timeout_s=5))
    assert result.ok, result
    assert (result.stdout, result.stderr, result.blocked) == (expected, "", None)
    assert not result.truncated and not result.timed_out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("code", "exit_code"),
    [
        ("pass", 0),
        ("import sys\nsys.exit(3)", 3),
        ("raise SystemExit(0)", 0),
        ("1 / 0", 1),
        ("import os\nos._exit(7)", 7),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", -15),
    ],
)
def test_exit_codes(code: str, exit_code: int) -> None:
    result = run_python(code)
    assert result.exit_code == exit_code
    assert result.ok == (exit_code == 0)


@pytest.mark.timeout(60)
def test_stderr_carries_the_traceback() -> None:
    result = run_python("def f():\n    raise ValueError('boom')\n\nf()")
    assert result.exit_code == 1 and not result.ok and result.blocked is None
    assert "Traceback (most recent call last)" in result.stderr
    assert 'File "main.py", line 4, in <module>' in result.stderr
    assert "raise ValueError('boom')" in result.stderr  # source lines are shown
    assert result.stderr.rstrip().endswith("ValueError: boom")
    assert "sandbox-guard" not in result.stderr  # no frames of the bootstrap

    syntax = run_python("def (:\n")
    assert syntax.exit_code == 1 and "SyntaxError" in syntax.stderr


@pytest.mark.timeout(60)
def test_output_is_capped_and_decoded_leniently() -> None:
    limits = SandboxLimits(max_output_chars=10)
    result = run_python("import sys\nprint('a' * 100)\nprint('e' * 100, file=sys.stderr)", limits)
    assert result.ok and result.truncated
    assert result.stdout == "a" * 10
    assert result.stderr == "e" * 9 + "\n"  # the tail
    raw = run_python("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe ok')")
    assert raw.stdout == "\ufffd\ufffd ok" and not raw.truncated


@pytest.mark.timeout(60)
def test_timeout_kills_within_the_limit(workdirs: list[str]) -> None:
    result = run_python("import os\nprint(os.getcwd(), flush=True)\nwhile True:\n    pass", FAST)
    assert result.timed_out and result.exit_code is None and not result.ok
    assert 1 <= result.duration_s < 1 + 3
    assert result.stdout.strip() == workdirs[-1]  # the snippet ran in the recorded dir...
    assert not os.path.exists(result.stdout.strip())  # ...which is gone, even after a timeout


@pytest.mark.timeout(60)
def test_each_run_gets_a_fresh_working_directory_that_is_removed() -> None:
    code = "import os\nprint(os.getcwd(), os.environ['HOME'], os.environ['TMPDIR'], os.listdir())"
    first, second = run_python(code), run_python(code)
    cwd, home, tmp, listing = first.stdout.split(" ", 3)
    assert cwd == home == tmp and listing.strip() == "['main.py']"
    assert second.stdout.split()[0] != cwd
    assert not os.path.exists(cwd) and not os.path.exists(second.stdout.split()[0])


@pytest.mark.timeout(60)
def test_allowed_processes_die_with_the_group(workdirs: list[str]) -> None:
    # The pid the snippet sees is its PID namespace's: look for the child by its environment.
    code = "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\nprint(pid)"
    result = run_python(code, SandboxLimits(timeout_s=5, max_processes=2))
    assert result.ok, result
    assert int(result.stdout) > 0
    deadline = time.monotonic() + 5
    while sandbox_processes(workdirs) and time.monotonic() < deadline:  # zombie until reaped
        time.sleep(0.05)
    assert sandbox_processes(workdirs) == [], "a process forked by the snippet survived"


@pytest.mark.timeout(60)
def test_secret_is_not_visible_even_in_the_parents_initial_environment() -> None:
    # /proc/<pid>/environ shows a process's *initial* environment, so start a parent that
    # has the secret from birth. sandbox.py is loaded without llmrl/envs/__init__ (torch).
    helper = (
        "import json, sys, types\n"
        "for name in ('llmrl', 'llmrl.envs'):\n"
        "    sys.modules[name] = types.ModuleType(name)\n"
        f"sys.modules['llmrl'].__path__ = [{str(Path(sandbox.__file__).parents[1])!r}]\n"
        f"sys.modules['llmrl.envs'].__path__ = [{str(Path(sandbox.__file__).parent)!r}]\n"
        "from llmrl.envs.sandbox import run_python\n"
        "r = run_python(sys.argv[1])\n"
        "print(json.dumps([r.stdout, r.stderr, r.blocked]))\n"
    )
    snippet = (
        "import os\nprint(os.environ.get('LLMRL_TEST_SECRET'))\n"
        "print(open(f'/proc/{os.getppid()}/environ', 'rb').read())"
    )
    env = {**os.environ, SECRET_NAME: SECRET_VALUE}
    proc = subprocess.run(
        [sys.executable, "-c", helper, snippet], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    stdout, stderr, blocked = __import__("json").loads(proc.stdout)
    assert stdout == "None\n" and blocked == "open"
    assert SECRET_VALUE not in stdout + stderr


@pytest.mark.timeout(60)
def test_kernel_layers_hold_without_the_audit_hook(tmp_path: Path) -> None:
    """Defence in depth: a bare interpreter in the same boundary (no guard, no hook)."""
    support = sandbox_support()
    if not support.seccomp:
        pytest.skip(f"no seccomp here: {support}")
    (tmp_path / "secret").write_text("host-file-secret")
    probe = (
        "import os, socket\n"
        "def attempt(name, f):\n"
        "    try:\n        f()\n        print(name, 'allowed')\n"
        "    except OSError as e:\n        print(name, 'denied', e.errno)\n"
        "attempt('fork', lambda: os.fork() or os.wait())\n"
        "attempt('kill-parent', lambda: os.kill(os.getppid(), 0))\n"
        "attempt('socket', socket.socket)\n"
        "attempt('setsid', os.setsid)\n"
        f"attempt('environ', lambda: open('/proc/{os.getpid()}/environ', 'rb').read())\n"
        f"attempt('write-outside', lambda: open({str(tmp_path / 'x')!r}, 'w'))\n"
        f"attempt('read-host-tmp', lambda: open({str(tmp_path / 'secret')!r}).read())\n"
        "attempt('read-shadow', lambda: open('/etc/shadow').read())\n"
        "attempt('list-root-home', lambda: os.listdir('/root') + os.listdir('/home'))\n"
        "attempt('write-inside', lambda: open('y', 'w'))\n"
    )
    workdir = tempfile.mkdtemp(prefix="llmrl-sandbox-test-")
    try:
        if support.uid_drop:
            os.chown(workdir, guard.NOBODY, guard.NOBODY)
        with sandbox._wrap(support, SandboxLimits(), workdir, ["-I", "-c", probe]) as launch:
            proc = subprocess.run(
                launch.command,
                cwd=workdir,
                env=guard.child_env(workdir),
                capture_output=True,
                text=True,
                timeout=30,
                start_new_session=True,
                pass_fds=launch.fds,
                preexec_fn=sandbox._preexec(SandboxLimits(), support, workdir),
            )
    finally:
        guard.remove_tree(workdir)
    outcome = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert outcome["fork"] == "denied 1" and outcome["socket"] == "denied 1", proc
    assert outcome["kill-parent"] == "denied 1" and outcome["setsid"] == "denied 1"
    assert outcome["write-inside"] == "allowed"
    if support.uid_drop or support.userns or support.root:  # another uid/namespace/no caps
        assert outcome["environ"].startswith("denied")
    if support.readonly_fs or support.uid_drop:
        assert outcome["write-outside"].startswith("denied")
        assert not (tmp_path / "x").exists()
    if support.boundary:  # the host's files are not there at all (ENOENT)
        for name in ("read-host-tmp", "read-shadow", "list-root-home"):
            assert outcome[name] == "denied 2", proc
    assert "host-file-secret" not in proc.stdout + proc.stderr


@pytest.mark.timeout(60)
def test_os_boundary_contains_what_the_audit_hook_misses(tmp_path: Path) -> None:
    """Modules that open files in C (sqlite ATTACH/VACUUM INTO, readline's history files,
    pwd/spwd, _posixshmem) get past the hook: the bubblewrap boundary must contain them.
    One run tries them all (see ``below-the-audit-hook`` in hostile_programs.py)."""
    import sqlite3
    from multiprocessing import shared_memory

    assert sandbox_support().boundary == "bubblewrap", sandbox_support()
    secrets = {name: f"{name}-{uuid.uuid4().hex}" for name in ("file", "db", "shm")}
    outside, db, escape = tmp_path / "secret.txt", tmp_path / "secret.db", tmp_path / "escape"
    outside.write_text(secrets["file"] + "\n")
    with sqlite3.connect(db) as connection:
        connection.execute("create table t (x)")
        connection.execute("insert into t values (?)", (secrets["db"],))
    connection.close()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    segment = shared_memory.SharedMemory(create=True, size=64)
    try:
        segment.buf[: len(secrets["shm"])] = secrets["shm"].encode()
        code = fill(
            PROGRAMS["below-the-audit-hook"],
            outside=outside,
            outsidedb=db,
            escape=escape,
            caller=os.getpid(),
            shm="/" + segment.name,
        )
        result = run_python(code, ROOMY)
    finally:
        segment.close()
        segment.unlink()
    got = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert len(got) == 15, result
    everything = result.stdout + result.stderr
    for secret in (*secrets.values(), SECRET_VALUE, "root:"):
        assert secret not in everything, result
    assert got["pwd"] == got["spwd"] == "got []"  # no host passwd or shadow database
    assert got["inherited-fds"] == "got []"  # bwrap's info and seccomp fds are not leaked
    assert got["shm-open"] == "denied FileNotFoundError"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written


@pytest.mark.timeout(60)
def test_boundary_without_its_own_proc(monkeypatch) -> None:
    """Where /proc is masked (containers), bwrap cannot mount one: the sandbox runs without."""
    from dataclasses import replace

    support = replace(sandbox_support(), proc=False)
    assert sandbox._probe(support)["host_files"] is False
    monkeypatch.setattr(sandbox, "sandbox_support", lambda: support)
    result = run_python("import os, json\nprint(os.path.exists('/proc'), json.dumps(os.getpid()))")
    assert result.ok and result.stdout == "False 2\n", result


@pytest.fixture
def fresh_support():
    """``sandbox_support`` probed anew inside the test, and again after it."""
    sandbox_support.cache_clear()
    yield
    sandbox_support.cache_clear()


@pytest.mark.timeout(60)
def test_no_boundary_is_refused_unless_opted_out(monkeypatch, caplog, fresh_support) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap to be found
    support = sandbox_support()
    assert support.boundary is None and "bwrap" in support.boundary_error
    with pytest.raises(sandbox.SandboxUnavailableError, match="apt-get install bubblewrap"):
        run_python("print(1)")
    optional = SandboxLimits(os_sandbox="optional")
    with caplog.at_level("WARNING", logger="llmrl.envs.sandbox"):
        first, second = run_python("print(1)", optional), run_python("print(2)", optional)
    assert (first.stdout, second.stdout) == ("1\n", "2\n")
    warnings = [r for r in caplog.records if "without the operating-system sandbox" in r.message]
    assert len(warnings) == 2  # one per sandbox started without it


@pytest.mark.timeout(60)
def test_concurrent_runs_do_not_interfere() -> None:
    snippets = [f"print({i} * {i})" for i in range(6)] + ["import os\nos.kill(os.getppid(), 9)"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda code: run_python(code, ROOMY), snippets))
    assert [r.stdout for r in results[:6]] == [f"{i * i}\n" for i in range(6)]
    assert results[-1].blocked == "os.kill"


@pytest.mark.timeout(60)
def test_as_message() -> None:
    def result(**kw) -> SandboxResult:
        base = dict(
            stdout="",
            stderr="",
            exit_code=0,
            timed_out=False,
            truncated=False,
            blocked=None,
            duration_s=0.5,
        )
        return SandboxResult(**{**base, **kw})

    assert result().as_message() == "(no output)"
    assert result(stdout="42\n").as_message() == "42"
    msg = result(stdout="a\n", stderr="x" * 5000, exit_code=1).as_message()
    assert msg.startswith("a\n") and msg.endswith("[exit code 1]") and "x" * 1500 in msg
    assert "x" * 1501 not in msg  # only the tail of stderr
    assert result(timed_out=True, exit_code=None, duration_s=1.02).as_message() == (
        "[timed out after 1.0s]"
    )
    assert result(exit_code=-11).as_message() == "[killed by signal SIGSEGV]"
    assert result(truncated=True, stdout="x").as_message() == "x\n[output truncated]"
    assert "[blocked: os.kill]" in result(blocked="os.kill", exit_code=1).as_message()
    assert result(stderr="boom\n", exit_code=1).ok is False and result().ok is True

    real = run_python("import os\nprint('before')\nos.kill(os.getppid(), 9)")
    msg = real.as_message()
    assert msg.startswith("before\n") and "PermissionError: sandbox: os.kill" in msg
    assert msg.endswith("[exit code 1]\n[blocked: os.kill]")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_s", 0),
        ("timeout_s", -1.0),
        ("timeout_s", float("nan")),
        ("timeout_s", "5"),
        ("timeout_s", True),
        ("memory_mb", 0),
        ("memory_mb", 1.5),
        ("max_output_chars", 0),
        ("max_file_mb", 0),
        ("max_processes", -1),
        ("allow_network", "yes"),
        ("os_sandbox", "off"),
    ],
)
def test_limits_are_validated(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        SandboxLimits(**{field: value})


@pytest.mark.timeout(60)
def test_bad_arguments_raise_in_the_caller() -> None:
    with pytest.raises(TypeError):
        run_python(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        run_python("print(1)", {"timeout_s": 1})  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_sandbox_support_is_reported() -> None:
    support = sandbox_support()
    assert support is sandbox_support()  # probed once
    assert support.root == (os.geteuid() == 0)
    assert not (support.uid_drop and not support.root)
    assert support.boundary == "bubblewrap", support  # `make test` installs bubblewrap
    assert support.boundary_error is None and support.pidns and support.userns


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("markdown", "blocks"),
    [
        ("no code here", []),
        ("```python\nprint(1)\n```", ["print(1)"]),
        ("text\n```python\na = 1\n```\nmore\n```py\nb = 2\n```\n", ["a = 1", "b = 2"]),
        ("```js\nalert(1)\n```\n```\nplain\n```\n```bash\nls\n```", []),
        ("```Python3 title=x\nx = 1\n\n  y = 2\n```", ["x = 1\n\n  y = 2"]),
        ("```python\nprint(1)```", ["print(1)"]),  # closing fence glued to the code
        ("```python\nfor i in range(3):\n    print(i)", ["for i in range(3):\n    print(i)"]),
        ("  ```python\n  if x:\n      y()\n  ```", ["if x:\n    y()"]),  # indented fence
        ("````python\ns = '```'\n````", ["s = '```'"]),
        ("```python\n```", [""]),
        ("~~~python\nz = 3\n~~~", ["z = 3"]),
    ],
)
def test_extract_python_blocks(markdown: str, blocks: list[str]) -> None:
    assert extract_python_blocks(markdown) == blocks
