"""The sandbox's operating-system layers (bubblewrap, seccomp, rlimits, another uid): what
they hold without the audit hook, what they contain that the hook misses, and the refusal to
run without them unless the limits opt out."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from llmrl.envs import _sandbox_guard as guard
from llmrl.envs import sandbox
from llmrl.envs.sandbox import SandboxLimits, run_python, sandbox_support
from tests.support.hostile_programs import PROGRAMS, fill
from tests.support.sandbox_checks import ROOMY, SECRET_NAME, SECRET_VALUE

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("secret_in_parent_env")]


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
def test_sandbox_support_is_reported() -> None:
    support = sandbox_support()
    assert support is sandbox_support()  # probed once
    assert support.root == (os.geteuid() == 0)
    assert not (support.uid_drop and not support.root)
    assert support.boundary == "bubblewrap", support  # `make test` installs bubblewrap
    assert support.boundary_error is None and support.pidns and support.userns
