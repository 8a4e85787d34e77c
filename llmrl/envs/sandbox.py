"""Run untrusted, LLM-written Python snippets (the ``PythonInterpreter`` tool) in a sandbox.

Each :func:`run_python` call starts a fresh ``python -I -B`` child in a new temporary working
directory (also its HOME and TMPDIR; removed afterwards, timeouts included), with an
environment built from scratch, stdout/stderr in files read back capped, and a wall-clock
timeout after which the child's whole process group is SIGKILLed. Whatever the snippet does
ends up in a :class:`SandboxResult`; only failures of the sandbox itself raise, and the caller
can serve the next request at once. Safe to call from several threads.

Threat model: the snippet is hostile (loops, forks, allocates, floods output, opens sockets,
reads secrets such as ``/proc/<caller>/environ`` or files through modules that open them in C,
signals or re-limits the caller).

* The operating-system boundary (``_bubblewrap.py``): the interpreter runs under bubblewrap in
  its own user, mount, PID, network, IPC and UTS namespaces, on a minimal read-only root (the
  system's ``/usr`` and ``/lib*``, Python's install; no ``/etc``, ``/home``, host ``/tmp`` or
  ``/dev/shm``), its own ``/proc`` where the host allows one, the working directory its only
  writable place; when the call ends, its whole PID namespace is killed and waited for. This is
  what contains native code and the stdlib modules that read files below the audit hook
  (sqlite ``ATTACH``/``VACUUM INTO``, readline's history files, ``pwd``/``spwd``,
  ``_posixshmem``). Without bubblewrap or user namespaces, :func:`run_python` raises
  :class:`SandboxUnavailableError` saying how to get them, unless ``limits.os_sandbox`` is
  ``"optional"``: then the layers below run alone and each run logs a warning. bwrap adds
  milliseconds per call, more when the cores are busy
  (docs/measurements.md#the-python-tools-sandbox).
* Enforced by the kernel (holds against native code too): rlimits (address space, file size,
  CPU time, open files, no core dumps; process count where it is per sandbox: dropped uid or
  user namespace) set between fork and exec; its own session and process group, and a
  parent-death SIGKILL; ``no_new_privs`` and a seccomp filter on x86_64/aarch64 (no fork
  unless ``max_processes``, no socket unless ``allow_network``; never ptrace, pidfd, setsid,
  namespaces, mounts or links, nor kill/prlimit/scheduling aimed at other processes), which
  bwrap loads last, before exec. As root the child runs as uid/gid 65534 or, when nobody
  cannot run this interpreter (pyenv under a 0700 /root, say), as the caller's uid. Without
  the boundary (``os_sandbox="optional"``), the preexec itself makes a private mount
  namespace (all but the working directory read-only) and network namespace, and installs
  the filter. :func:`sandbox_support` reports what this machine grants.
* Enforced by an audit hook in the child (``_sandbox_guard.py``): opening, listing or changing
  files outside the working directory (Python's own install stays readable), process
  creation, signals and prlimit on others, sockets and urllib, ctypes/cffi, subinterpreters,
  gc and trace introspection. A denial prints ``LLMRL_SANDBOX_BLOCKED <event>`` to stderr
  (parsed into ``blocked``; imports a library merely probes, as numpy does ctypes, are not
  reported) and raises PermissionError (ImportError for imports). Best effort: audit hooks
  are no security boundary; it is the second layer inside the boundary. With
  ``max_processes > 0``, programs the snippet starts run unhooked (still inside bwrap).

Not contained: the number of files written in the working directory (only their size is
capped), load on the machine within the limits, a snippet forging its own marker, and kernel
bugs reachable from inside (the sandbox shares the env worker's kernel). Exit statuses above
128 are reported as signals (bwrap's convention). On a cluster, run env workers in their own
unprivileged pods (no service-account token or secrets mounted, egress denied by a
NetworkPolicy), under gVisor or a VM runtime for untrusted models, with this as the inner layer.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import mmap
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import _bubblewrap as bubblewrap
from . import _sandbox_guard as guard

OS_SANDBOX_MODES = ("required", "optional")
logger = logging.getLogger(__name__)
_MARKER = guard.MARKER.encode()
_MARKER_LINE = re.compile(re.escape(guard.MARKER) + r" [^\n]*\n?")


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run. ``max_processes`` counts processes beyond the snippet's."""

    timeout_s: float = 5.0
    memory_mb: int = 256
    max_output_chars: int = 4000
    max_file_mb: int = 16
    max_processes: int = 0
    allow_network: bool = False
    os_sandbox: str = "required"  # "required" or "optional": see PythonToolSettings.os_sandbox

    def __post_init__(self) -> None:
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 3600:
            raise ValueError(f"timeout_s must be a number of seconds in (0, 3600], got {t!r}")
        minimum = {"memory_mb": 64, "max_output_chars": 1, "max_file_mb": 1, "max_processes": 0}
        for name, low in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not isinstance(self.allow_network, bool):
            raise ValueError(f"allow_network must be a bool, got {self.allow_network!r}")
        if self.os_sandbox not in OS_SANDBOX_MODES:
            raise ValueError(
                f"os_sandbox must be one of {OS_SANDBOX_MODES}, got {self.os_sandbox!r}"
            )


@dataclass(frozen=True)
class SandboxResult:
    """What a snippet did. ``exit_code`` is None after a timeout, negative for a signal."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    blocked: str | None
    duration_s: float

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0

    def as_message(self, max_stderr_chars: int = 1500) -> str:
        """A compact tool reply for the LLM: stdout, the tail of stderr, then notes."""
        parts = [self.stdout.rstrip("\n")] if self.stdout.strip() else []
        if self.stderr.strip():
            parts.append(self.stderr.rstrip("\n")[-max_stderr_chars:])
        if self.timed_out:
            parts.append(f"[timed out after {self.duration_s:.1f}s]")
        elif self.exit_code is not None and self.exit_code < 0:
            parts.append(f"[killed by signal {_signal_name(-self.exit_code)}]")
        elif self.exit_code:
            parts.append(f"[exit code {self.exit_code}]")
        if self.truncated:
            parts.append("[output truncated]")
        if self.blocked:
            parts.append(f"[blocked: {self.blocked}]")
        return "\n".join(parts) if parts else "(no output)"


class SandboxUnavailableError(RuntimeError):
    """No operating-system boundary here, and the limits require one (``os_sandbox``)."""


@dataclass(frozen=True)
class SandboxSupport:
    """Which kernel-enforced layers this machine grants (probed once per process)."""

    root: bool  # the caller runs as root
    uid_drop: bool  # snippets run as 65534 (else the caller's uid; without capabilities if 0)
    seccomp: bool
    netns: bool  # private network namespace
    userns: bool  # private user namespace
    readonly_fs: bool  # private mount namespace: read-only but for the working directory
    boundary: str | None = None  # "bubblewrap" when snippets run under it, else None
    boundary_error: str | None = None  # why there is no boundary
    pidns: bool = False  # private PID namespace
    proc: bool = False  # under bubblewrap: a /proc of its own (False: no /proc at all)


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``code`` in a fresh sandboxed interpreter and report what happened.

    Failures of the sandbox itself (no temp dir, no interpreter) raise; anything the snippet
    does, including crashing or hanging, is reported in the result.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if not isinstance(limits, SandboxLimits):
        raise TypeError(f"limits must be SandboxLimits, got {type(limits).__name__}")
    support = sandbox_support()
    if support.boundary is None:
        if limits.os_sandbox == "required":
            raise SandboxUnavailableError(
                f"no operating-system sandbox for Python snippets here: "
                f"{support.boundary_error}. {bubblewrap.HOW_TO_GET_ONE}"
            )
        logger.warning(
            "running a Python snippet without the operating-system sandbox (os_sandbox is "
            "'optional'; only rlimits, seccomp and the audit hook contain it): %s",
            support.boundary_error,
        )
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="llmrl-sandbox-"))
    try:
        script = os.path.join(workdir, "main.py")
        with open(script, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(code)
        if support.uid_drop:
            for path in (workdir, script):
                os.chown(path, guard.NOBODY, guard.NOBODY)
        with (
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            _launch(support, limits, workdir) as launch,
        ):
            start = time.monotonic()
            proc = subprocess.Popen(
                launch.command,
                cwd=workdir,
                env=guard.child_env(workdir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                close_fds=True,
                pass_fds=launch.fds,
                start_new_session=True,
                preexec_fn=_preexec(limits, support, workdir),
            )
            try:
                launch.started()
                finished = guard.wait_exited(proc.pid, limits.timeout_s)
            finally:  # the group dies with the child, or on timeout, or if we are interrupted
                guard.kill_group(proc.pid)
                proc.wait()
                launch.reap()  # and bwrap's PID namespace with it
            duration = time.monotonic() - start
            stdout, cut_out = _read_head(out, limits.max_output_chars)
            stderr, cut_err = _read_tail(err, limits.max_output_chars)
            blocked = _first_marker(err)
        code = proc.returncode
        if support.boundary is not None:
            code = bubblewrap.exit_status(code)
        return SandboxResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=code if finished else None,
            timed_out=not finished,
            truncated=cut_out or cut_err,
            blocked=blocked,
            duration_s=duration,
        )
    finally:
        guard.remove_tree(workdir)


def extract_python_blocks(markdown: str) -> list[str]:
    """Contents of the fenced code blocks labelled ``python``/``py``/``python3``, in order.

    Other languages are skipped; a block left open runs to the end of the text, and a closing
    fence glued to the last code line (``print(1)```) still closes it.
    """
    blocks: list[str] = []
    lines: list[str] | None = None  # the open block's lines
    fence, indent, keep = "", 0, False

    def close() -> None:
        if keep:
            dedent = [ln[min(indent, len(ln) - len(ln.lstrip(" "))) :] for ln in lines]
            blocks.append("\n".join(dedent))

    for line in markdown.splitlines():
        stripped = line.lstrip(" ")
        if lines is None:
            m = re.match(r"(`{3,}|~{3,})[ \t]*([\w.+-]*)", stripped)
            if m and len(line) - len(stripped) <= 3 and "`" not in stripped[len(m[1]) :]:
                lines, fence, indent = [], m[1], len(line) - len(stripped)
                keep = m[2].lower() in ("python", "py", "python3")
            continue
        body = line.rstrip()
        head = body.rstrip(fence[0])
        if len(body) - len(head) < len(fence):
            lines.append(line)
            continue
        if head.strip():
            lines.append(head)
        close()
        lines = None
    if lines is not None:
        close()
    return blocks


@functools.lru_cache(maxsize=1)
def sandbox_support() -> SandboxSupport:
    """Probe (once) which kernel layers work here: first bubblewrap (the operating-system
    boundary), then, for runs that opt out of it, the older in-process layers; as root,
    whether nobody can run Python. The first that starts wins."""
    root, errors = os.geteuid() == 0, []
    drops = (True, False) if root else (False,)
    path = bubblewrap.find()
    if path is None:
        errors.append("bubblewrap (bwrap) is not on PATH")
    for drop, proc in ((d, p) for p in (True, False) for d in drops) if path else ():
        support = SandboxSupport(root, drop, True, True, True, True, "bubblewrap", pidns=True)
        support = replace(support, proc=proc)
        try:
            info = _probe(support)
        except (OSError, RuntimeError) as exc:  # e.g. user namespaces refused
            errors.append(f"bwrap{'' if proc else ' without /proc'}{_as(drop)}: {exc}")
            continue
        if info.pop("host_files") or not all(v for k, v in info.items() if k != "proc"):
            errors.append(f"bwrap{_as(drop)} started with host files or without a layer: {info}")
            continue
        return support
    boundary_error = "; ".join(errors)
    for drop in drops:
        support = SandboxSupport(root, drop, False, False, False, False, None, boundary_error)
        try:
            info = _probe(support)
        except (OSError, RuntimeError) as exc:  # e.g. nobody may not reach the interpreter
            errors.append(f"in-process layers{_as(drop)}: {exc}")
            continue
        del info["host_files"], info["proc"]
        return replace(support, **info)
    raise RuntimeError(f"the sandbox cannot start {_interpreter()}: {'; '.join(errors)}")


# ------------------------------------------------------------------------------- helpers
def _interpreter() -> str:
    if not sys.executable:
        raise RuntimeError("sys.executable is unknown; the sandbox needs a Python interpreter")
    return sys.executable


@functools.lru_cache(maxsize=1)
def _guard_source() -> str:
    return Path(guard.__file__).read_text(encoding="utf-8")


def _as(drop: bool) -> str:
    return " as nobody" if drop else ""


def _probe(support: SandboxSupport) -> dict[str, bool]:
    limits = SandboxLimits()
    return guard.probe(
        lambda workdir, argv: _wrap(support, limits, workdir, argv),
        lambda workdir: _preexec(limits, support, workdir),
        support.uid_drop,
    )


def _launch(support: SandboxSupport, limits: SandboxLimits, workdir: str):
    """The command line running the guard and the snippet, and the descriptors it needs."""
    config = {"root": workdir, "allow_network": limits.allow_network}
    config["max_processes"] = limits.max_processes
    if support.boundary is not None:
        config["nproc"] = 1 + limits.max_processes + guard.THREAD_ALLOWANCE
    argv = ["-I", "-B", "-c", guard.BOOTSTRAP, _guard_source(), json.dumps(config)]
    return _wrap(support, limits, workdir, argv)


@contextlib.contextmanager
def _wrap(support: SandboxSupport, limits: SandboxLimits, workdir: str, argv: list[str]):
    """``argv`` (the interpreter's arguments) under bubblewrap when ``support`` has it."""
    if support.boundary is None:
        yield bubblewrap.Launch([_interpreter(), *argv])
        return
    launch = bubblewrap.command(
        bubblewrap.find() or "bwrap",
        [_interpreter(), *argv],
        readable=(*guard.read_roots(), os.path.dirname(_interpreter())),
        workdir=workdir,
        seccomp=guard.seccomp_program(
            bubblewrap.SANDBOX_PID,
            max_processes=limits.max_processes,
            allow_network=limits.allow_network,
        ),
        allow_network=limits.allow_network,
        proc=support.proc,
    )
    try:
        yield launch
    finally:
        launch.close()


def _preexec(limits: SandboxLimits, support: SandboxSupport, workdir: str):
    return guard.make_preexec(
        workdir=workdir,
        memory_mb=limits.memory_mb,
        max_file_mb=limits.max_file_mb,
        cpu_s=math.ceil(limits.timeout_s) + 1,
        max_processes=limits.max_processes,
        allow_network=limits.allow_network,
        drop_to=guard.NOBODY if support.uid_drop else None,
        boundary=support.boundary is not None,
    )


def _read_head(f, limit: int) -> tuple[str, bool]:
    f.seek(0)
    data = f.read(4 * limit + 4)
    text = data.decode("utf-8", errors="replace")
    return text[:limit], len(text) > limit or bool(f.read(1))


def _read_tail(f, limit: int) -> tuple[str, bool]:
    size = f.seek(0, os.SEEK_END)
    start = max(0, size - 4 * limit - 4 * 200)  # room for the marker lines removed below
    f.seek(start)
    text = _MARKER_LINE.sub("", f.read().decode("utf-8", errors="replace"))
    return text[-limit:], start > 0 or len(text) > limit


def _first_marker(f) -> str | None:
    """The event named by the first ``LLMRL_SANDBOX_BLOCKED <event>`` line, if any."""
    if os.fstat(f.fileno()).st_size == 0:
        return None
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        i = m.find(_MARKER + b" ")
        if i < 0:
            return None
        line = m[i + len(_MARKER) + 1 : i + len(_MARKER) + 200].split(b"\n", 1)[0]
    return line.decode("utf-8", errors="replace").strip() or None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
