"""The operating-system boundary of :mod:`llmrl.envs.sandbox` (private): bubblewrap.

Each snippet's interpreter runs under ``bwrap`` in its own user, mount, PID, network, IPC and
UTS namespaces, on a root made of read-only binds of only what the interpreter needs (``/usr``,
the ``/lib*``/``/bin`` links, Python's install: its prefixes, stdlib and site-packages), its own
``/proc`` (its PID namespace's) and a minimal read-only ``/dev``, with the working directory as
the one writable place, bound at the same path so the audit-hook guard inside sees the same
paths as the caller. No ``/etc`` (so no passwd, shadow or ld.so.cache: glibc finds its libraries
on its built-in paths), no ``/home``, no host ``/tmp`` or ``/dev/shm``, nothing of ``/root`` but
the interpreter's own install when it lives there (pyenv).

Layers compose as follows. The caller's ``preexec_fn`` (``_sandbox_guard.make_preexec`` with
``boundary=True``) sets the rlimits, the uid drop, ``no_new_privs`` and the parent-death signal
before ``exec``-ing bwrap: bwrap is a normal process, and they are inherited by everything it
starts. The seccomp filter cannot be installed there, because bwrap itself needs ``clone`` with
namespace flags, ``mount`` and ``setsid``; bwrap loads it instead from ``--seccomp FD`` as the
last step before ``exec``-ing the interpreter (after dropping all capabilities). The filter's
"own pid" is 2: bwrap's init is pid 1 of the new PID namespace and the interpreter its first
child. ``RLIMIT_NPROC`` is set by the guard inside (``nproc`` in its config): set before bwrap
it would count every process of the caller's uid when bwrap creates the user namespace.

This module only builds command lines; :func:`llmrl.envs.sandbox.sandbox_support` probes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass

SANDBOX_PID = 2  # the interpreter's pid inside its PID namespace (bwrap's init is 1)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
NETWORK_FILES = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl")

HOW_TO_GET_ONE = (
    "Install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; the llmrl cpu and gpu "
    "images have it) on a kernel that allows unprivileged user namespaces "
    "(user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 on older Debian; "
    "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap on "
    "Ubuntu 24.04). On Kubernetes the env-worker pods also need a seccomp profile that allows "
    "unshare/clone with CLONE_NEWUSER (containerd's and Docker's RuntimeDefault do not; CRI-O's "
    "does) and an unmasked /proc or none (see 'Python tool sandbox' in helm/llmrl/values.yaml). "
    "Or set tools.python.os_sandbox: optional to run snippets without this boundary (logged "
    "as a warning at each run), e.g. where a gVisor runtime class isolates the pod."
)


def find() -> str | None:
    """The ``bwrap`` executable on ``PATH``, or None."""
    return shutil.which("bwrap")


def mounts(readable: Sequence[str], workdir: str, *, proc: bool, allow_network: bool) -> list[str]:
    """bwrap's filesystem arguments: read-only system and Python dirs, ``workdir`` writable."""
    args: list[str] = []
    bound: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(path + "/")
    for path in sorted(set(readable), key=len):  # parents first; skip what a bind covers
        if os.path.isdir(path) and not (path + "/").startswith(tuple(bound)):
            args += ["--ro-bind", path, path]
            bound.append(path + "/")
    if allow_network:
        for path in NETWORK_FILES:
            args += ["--ro-bind-try", path, path]
    if proc:
        args += ["--proc", "/proc"]
    args += ["--dev", "/dev", "--bind", workdir, workdir, "--chdir", workdir]
    return [*args, "--remount-ro", "/dev", "--remount-ro", "/"]


@dataclass
class Launch:
    """A command line, the descriptors to pass it and, under bwrap, the PID namespace's init.

    bwrap's init (pid 1 inside) dies by the parent-death signal when the outer bwrap is
    killed, but asynchronously: :meth:`reap` kills it outright and waits until it is gone,
    which takes the whole PID namespace with it, so nothing of a run outlives the call.
    """

    command: list[str]
    fds: tuple[int, ...] = ()
    info: int | None = None  # read end of bwrap's --info-fd pipe
    init: int | None = None  # pidfd of bwrap's init

    def started(self) -> None:
        """After the Popen: close our copies of the passed descriptors, find the init."""
        for fd in self.fds:
            os.close(fd)
        self.fds = ()
        if self.info is None:
            return
        with os.fdopen(self.info, "rb") as f:  # EOF when bwrap has cloned (or died)
            self.info, text = None, f.read(4096)
        with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
            self.init = os.pidfd_open(json.loads(text)["child-pid"])

    def reap(self, timeout_s: float = 10.0) -> None:
        """Kill bwrap's init (if any) and wait for it and its PID namespace to be gone."""
        if self.init is None:
            return
        try:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.init, signal.SIGKILL)
            select.select([self.init], [], [], timeout_s)  # readable once it has exited
        finally:
            os.close(self.init)
            self.init = None

    def close(self) -> None:
        for fd in (*self.fds, self.info):
            if fd is not None:
                os.close(fd)
        self.fds, self.info = (), None
        self.reap()


def command(
    bwrap: str,
    argv: Sequence[str],
    *,
    readable: Sequence[str],
    workdir: str,
    seccomp: bytes | None,
    allow_network: bool,
    proc: bool = True,
) -> Launch:
    """The launch of ``argv`` under bwrap: its command line and the descriptors to pass
    (the seccomp filter's and the write end of the info pipe)."""
    namespaces = ["--unshare-all", "--unshare-user"] + (["--share-net"] if allow_network else [])
    info, info_write = os.pipe()
    fds, extra = (info_write,), ["--info-fd", str(info_write)]
    if seccomp is not None:
        fd = os.memfd_create("llmrl-seccomp", 0)  # bwrap reads it to the end
        os.write(fd, seccomp)
        os.lseek(fd, 0, os.SEEK_SET)
        fds, extra = (*fds, fd), [*extra, "--seccomp", str(fd)]
    command = [bwrap, *namespaces, "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    command += mounts(readable, workdir, proc=proc, allow_network=allow_network)
    return Launch([*command, *extra, "--", *argv], fds, info)


def exit_status(code: int) -> int:
    """bwrap reports a child killed by signal N as 128 + N: turn that back into -N."""
    return -(code - 128) if 128 < code < 128 + 65 else code
