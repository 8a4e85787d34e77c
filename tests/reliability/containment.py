"""What a hostile tool call may leave behind in the process that runs the env, and the probes
that find it: surviving processes, signals delivered to the caller, changed resource limits,
leaked descriptors and the sandbox's working directories."""

from __future__ import annotations

import resource
import signal
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

# Catchable signals a snippet could aim at its parent. SIGCHLD is left out: every sandbox
# child that exits sends it, legitimately. SIGALRM belongs to pytest-timeout.
WATCHED_SIGNALS = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGPIPE,
    signal.SIGTERM,
    signal.SIGCONT,
    signal.SIGTSTP,
    signal.SIGWINCH,
)
WATCHED_LIMITS = (resource.RLIMIT_NOFILE, resource.RLIMIT_AS, resource.RLIMIT_NPROC)
SANDBOX_PREFIX = "llmrl-sandbox-"  # the prefix of run_python's working directories


@contextmanager
def signals_received() -> Iterator[list[int]]:
    """Record the watched signals this (main-thread) process receives; handlers restored."""
    received: list[int] = []
    previous = {
        s: signal.signal(s, lambda number, _: received.append(number)) for s in WATCHED_SIGNALS
    }
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def sandbox_workdirs() -> Iterator[list[str]]:
    """Record the working directories ``run_python`` creates (from any thread) meanwhile."""
    made: list[str] = []
    real = tempfile.mkdtemp

    def recording(*args, **kwargs) -> str:
        path = real(*args, **kwargs)
        if kwargs.get("prefix") == SANDBOX_PREFIX:  # not the probe of sandbox_support
            made.append(path)
        return path

    tempfile.mkdtemp = recording
    try:
        yield made
    finally:
        tempfile.mkdtemp = real


@dataclass(frozen=True)
class ProcessState:
    """The calling process's descendants, descriptors and limits at one moment."""

    descendants: frozenset[int]
    fds: int
    limits: tuple[tuple[int, int], ...]

    @classmethod
    def now(cls) -> ProcessState:
        me = psutil.Process()
        children = frozenset(p.pid for p in me.children(recursive=True))
        return cls(children, me.num_fds(), tuple(resource.getrlimit(r) for r in WATCHED_LIMITS))


def leftover_processes(
    before: ProcessState, needles: Iterable[str], grace_s: float = 10.0
) -> list[str]:
    """Processes still alive after ``grace_s``: new descendants of this process (zombies
    included: the env must reap its children) and, anywhere on the machine, live processes
    whose command line contains one of ``needles`` (a run's marker or working directory)."""
    needles = [n for n in needles if n]
    deadline = time.monotonic() + grace_s
    while True:
        found = _survivors(before, needles)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def _survivors(before: ProcessState, needles: list[str]) -> list[str]:
    found = []
    me = psutil.Process()
    for child in me.children(recursive=True):
        if child.pid not in before.descendants:
            found.append(_describe(child))
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE or proc.pid == me.pid:
            continue
        cmdline = " ".join(info["cmdline"] or ())
        if any(needle in cmdline for needle in needles):
            found.append(_describe(proc))
    return sorted(set(found))


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} ({proc.status()}): {' '.join(proc.cmdline())[:120]}"
    except psutil.Error:  # gone meanwhile: still report it, it was alive a moment ago
        return f"{proc.pid} (gone)"
