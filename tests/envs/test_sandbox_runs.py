"""The Python sandbox on ordinary code: what it prints, its exit codes, tracebacks, the
output cap, the timeout, its working directory, its processes, concurrent runs and the result
as a tool message."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from llmrl.envs.sandbox import SandboxLimits, SandboxResult, run_python
from tests.support.sandbox_checks import FAST, ROOMY, sandbox_processes

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("secret_in_parent_env")]


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
