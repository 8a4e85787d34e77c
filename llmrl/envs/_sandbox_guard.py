"""Containment mechanics behind :mod:`llmrl.envs.sandbox` (private; see its threat model).

* Kernel side, in the caller: :func:`make_preexec` confines the forked child before ``exec``
  (namespaces, read-only mounts, capability and uid drop, ``no_new_privs``, seccomp-bpf,
  rlimits); :func:`probe` finds out which of those this machine grants; the waiting, group
  kill and cleanup helpers make sure nothing outlives a run.
* Interpreter side, in the child: ``sandbox.py`` runs this file's source through
  :data:`BOOTSTRAP` in ``python -I -B``; :func:`child_main` trims ``sys.path``, installs the
  audit hook of :func:`make_hook` and executes the snippet (``main.py``) as ``__main__``.

So it must stay importable by the bare sandboxed interpreter: standard library only, and
nothing but definitions at import time.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import struct
import sys

MARKER = "LLMRL_SANDBOX_BLOCKED"
# Compiles this file's source (argv[1]) under a recognisable name for tracebacks.
BOOTSTRAP = "import sys; exec(compile(sys.argv[1], '<sandbox-guard>', 'exec'))"
NOBODY = 65534
THREAD_ALLOWANCE = 32  # RLIMIT_NPROC counts threads too; leave room for a small thread pool.

# ----------------------------------------------------------------------------- audit policy
ALWAYS_DENIED = frozenset({
    # Ways to find and rewrite the hook or to run code it does not see.
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
    "sys._current_frames", "cpython.PyInterpreterState_New",
    # Native code and links out of the working directory.
    "sqlite3.enable_load_extension", "sqlite3.load_extension", "os.symlink", "os.link",
})  # fmt: skip
PROCESS_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system", "os.spawn", "pty.spawn",
    "subprocess.Popen", "_posixsubprocess.fork_exec", "os.startfile",
})  # fmt: skip
NETWORK_EVENTS = frozenset({
    "urllib.Request", "http.client.connect", "ftplib.connect", "smtplib.connect",
    "poplib.connect", "imaplib.open", "nntplib.connect", "telnetlib.Telnet.open",
    "webbrowser.open",
})  # fmt: skip
BLOCKED_MODULES = frozenset({
    "ctypes", "_ctypes", "cffi", "_cffi_backend", "_xxsubinterpreters", "_xxinterpchannels",
    "_interpreters", "_interpchannels", "_testcapi", "_testinternalcapi",
})  # fmt: skip
READ_EVENTS = frozenset({"os.listdir", "os.scandir", "os.getxattr", "os.listxattr"})
WRITE_EVENTS = frozenset({
    "os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.chmod", "os.chown", "os.utime",
    "os.truncate", "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "os.mkfifo",
    "os.mknod", "sqlite3.connect",
})  # fmt: skip
# os functions whose path arguments the hook checks; see accept_path_objects().
PATH_FUNCTIONS = (
    "open", "listdir", "scandir", "chdir", "mkdir", "rmdir", "remove", "unlink", "rename",
    "replace", "chmod", "chown", "lchown", "utime", "truncate", "mkfifo", "mknod", "getxattr",
    "listxattr", "setxattr", "removexattr",
)  # fmt: skip
DEV_RW = ("/dev/null",)
DEV_RO = ("/dev/urandom", "/dev/random", "/dev/zero")

# --------------------------------------------------------------------------- seccomp policy
# (AUDIT_ARCH_*, syscall numbers). Architectures not listed run without the filter.
_SYSCALLS = {
    "x86_64": (0xC000003E, {
        "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "execve": 59, "execveat": 322,
        "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "pidfd_open": 434, "pidfd_send_signal": 424,
        "pidfd_getfd": 438, "prlimit64": 302, "setpriority": 141, "ioprio_set": 251,
        "sched_setaffinity": 203, "sched_setparam": 142, "sched_setscheduler": 144,
        "sched_setattr": 314, "setsid": 112, "setpgid": 109, "socket": 41, "socketpair": 53,
        "unshare": 272, "setns": 308, "mount": 165, "bpf": 321, "userfaultfd": 323,
        "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249,
        "io_uring_setup": 425, "symlink": 88, "symlinkat": 266, "link": 86, "linkat": 265,
    }),
    "aarch64": (0xC00000B7, {
        "clone": 220, "clone3": 435, "execve": 221, "execveat": 281, "kill": 129,
        "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_open": 434,
        "pidfd_send_signal": 424, "pidfd_getfd": 438, "prlimit64": 261, "setpriority": 140,
        "ioprio_set": 30, "sched_setaffinity": 122, "sched_setparam": 118,
        "sched_setscheduler": 119, "sched_setattr": 274, "setsid": 157, "setpgid": 154,
        "socket": 198, "socketpair": 199, "unshare": 97, "setns": 268, "mount": 40, "bpf": 280,
        "userfaultfd": 282, "perf_event_open": 241, "keyctl": 219, "add_key": 217,
        "request_key": 218, "io_uring_setup": 425, "symlinkat": 36, "linkat": 37,
    }),
}  # fmt: skip
_DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_send_signal",
    "pidfd_getfd", "tkill", "setpriority", "ioprio_set", "setsid", "setpgid", "unshare",
    "setns", "mount", "bpf", "userfaultfd", "perf_event_open", "keyctl", "add_key",
    "request_key", "io_uring_setup", "symlink", "symlinkat", "link", "linkat",
)  # fmt: skip
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|.., BPF_RET
_ALLOW, _KILL, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_CLONE_THREAD, _CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = (
    0x10000,
    0x20000,
    0x10000000,
    0x40000000,
)
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
_MS_KEEP = {b"nosuid": 2, b"nodev": 4, b"noexec": 8, b"noatime": 1024, b"nodiratime": 2048,
            b"relatime": 1 << 21, b"strictatime": 1 << 24}  # fmt: skip
_PR_SET_PDEATHSIG, _PR_SET_SECCOMP, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 22, 24, 38


def seccomp_program(pid: int, *, max_processes: int, allow_network: bool) -> bytes | None:
    """A classic-BPF seccomp filter for process ``pid``, or None on unsupported machines.

    Always: no ptrace/process_vm/pidfd, no signals, rlimit or scheduler changes aimed at
    other processes, no new session/process group (so a group kill reaches everything), no
    namespaces, mounts, bpf, keyrings, io_uring or (sym)links. Without ``max_processes``: no
    fork/vfork/clone of processes (threads are fine). Without network: no socket.

    ``execve`` stays allowed (the filter is installed before the interpreter is exec'd):
    without fork it can only replace the sandboxed process itself, which keeps every limit.
    """
    table = _SYSCALLS.get(os.uname().machine)
    if table is None or sys.byteorder != "little" or sys.maxsize < 2**32:
        return None
    arch, nr = table
    eperm = _ERRNO | errno.EPERM

    def only(arg: int, *values: int) -> list[tuple[int, int, int, int]]:
        """Allow when syscall argument ``arg`` (low 32 bits) is one of ``values``."""
        checks = [(_JEQ, len(values) - i, 0, v & 0xFFFFFFFF) for i, v in enumerate(values)]
        return [(_LD, 0, 0, 16 + 8 * arg), *checks, (_RET, 0, 0, eperm), (_RET, 0, 0, _ALLOW)]

    deny = list(_DENIED_SYSCALLS)
    rules = {"kill": only(0, pid, 0, -pid), "prlimit64": only(0, 0, pid)}
    for name in ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        rules[name] = only(0, pid)
    for name in ("sched_setaffinity", "sched_setparam", "sched_setscheduler", "sched_setattr"):
        rules[name] = only(0, 0, pid)
    if not max_processes:
        deny += ["fork", "vfork"]
        rules["clone"] = [(_LD, 0, 0, 16), (_JSET, 0, 1, _CLONE_THREAD)]
        rules["clone"] += [(_RET, 0, 0, _ALLOW), (_RET, 0, 0, eperm)]
        rules["clone3"] = [(_RET, 0, 0, _ERRNO | errno.ENOSYS)]  # libc falls back to clone
    if not allow_network:
        deny += ["socket", "socketpair"]
    rules.update({name: [(_RET, 0, 0, eperm)] for name in deny})
    prog = [(_LD, 0, 0, 4), (_JEQ, 1, 0, arch), (_RET, 0, 0, _KILL), (_LD, 0, 0, 0)]
    if arch == 0xC000003E:  # x32 syscalls (nr | 0x40000000) would dodge the numbers above
        prog += [(_JGE, 0, 1, 0x40000000), (_RET, 0, 0, eperm)]
    for name, block in rules.items():
        if name in nr:
            prog += [(_JEQ, 0, len(block), nr[name]), *block]
    prog.append((_RET, 0, 0, _ALLOW))
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def readonly_mounts(libc, keep: str) -> bool:
    """In a fresh mount namespace: every mount read-only except ``keep`` (bound onto itself).

    Locked flags (nosuid, nodev, ...) are carried over, as a user namespace requires.
    """
    keep_b = os.fsencode(keep)
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False
    if libc.mount(keep_b, keep_b, None, _MS_BIND | _MS_REC, None) != 0:
        return False
    with open("/proc/self/mountinfo", "rb") as f:
        mounts = [line.split()[4:6] for line in f.read().splitlines()]
    done = True
    for point, options in mounts:
        for escaped, char in ((b"\\040", b" "), (b"\\011", b"\t"), (b"\\012", b"\n")):
            point = point.replace(escaped, char)
        point = point.replace(b"\\134", b"\\")
        if point == keep_b:
            continue
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
        flags |= sum(_MS_KEEP.get(o, 0) for o in options.split(b","))
        done = libc.mount(None, point, None, flags, None) == 0 and done
    os.chdir(keep)  # the old cwd still points into the (now read-only) mount underneath
    return done


@functools.lru_cache(maxsize=1)
def load_libc():
    """libc through ctypes (caller side only), or None where that is unavailable."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None


def make_preexec(
    *,
    workdir: str,
    memory_mb: int,
    max_file_mb: int,
    cpu_s: int,
    max_processes: int,
    allow_network: bool,
    drop_to: int | None,
    boundary: bool = False,
):
    """The ``preexec_fn`` that confines the child between ``fork`` and ``exec``.

    Runs after ``start_new_session`` (setsid). Namespace, capability and seccomp steps are
    best effort (refusals are ignored); the uid drop, when asked for, must succeed. With
    ``boundary`` the child execs bubblewrap (``_bubblewrap.py``), which makes the namespaces,
    mounts and seccomp filter itself: only rlimits (but ``RLIMIT_NPROC``, set by the guard
    inside), the uid drop, ``no_new_privs`` and the parent-death signal are set here.
    """
    import ctypes
    import resource

    libc = load_libc()
    root = os.geteuid() == 0

    def prctl(*args: int) -> int:
        return libc.prctl(*(ctypes.c_ulong(a) for a in args))

    def lower(res: int, soft: int, hard: int | None = None) -> None:
        cap = resource.getrlimit(res)[1]
        limits = (soft, soft if hard is None else hard)
        if cap != resource.RLIM_INFINITY:
            limits = (min(limits[0], cap), min(limits[1], cap))
        resource.setrlimit(res, limits)

    def preexec() -> None:
        userns = False
        if libc is not None and not boundary:
            flags = _CLONE_NEWNS | (0 if allow_network else _CLONE_NEWNET)
            if libc.unshare(flags | (0 if root else _CLONE_NEWUSER)) == 0:
                userns = not root
                readonly_mounts(libc, workdir)
            if root:
                for cap in range(64):  # empty bounding set: exec can never regain capabilities
                    prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
        if drop_to is not None:
            os.setgroups([])
            os.setgid(drop_to)
            os.setuid(drop_to)
        elif root and libc is not None and not boundary:  # uid 0 without any capability
            header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
            libc.capset(header, (ctypes.c_uint32 * 6)())
        if libc is not None:
            prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)  # after setuid, which clears it
            prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if libc is not None and not boundary:
            program = seccomp_program(
                os.getpid(), max_processes=max_processes, allow_network=allow_network
            )
            if program is not None:
                buf = ctypes.create_string_buffer(program, len(program))
                fprog = (ctypes.c_ulong * 2)(len(program) // 8, ctypes.addressof(buf))
                prctl(_PR_SET_SECCOMP, 2, ctypes.addressof(fprog), 0, 0)  # SECCOMP_MODE_FILTER
        lower(resource.RLIMIT_CORE, 0)
        lower(resource.RLIMIT_NOFILE, 64)
        lower(resource.RLIMIT_FSIZE, max_file_mb << 20)
        lower(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)  # SIGXCPU first, SIGKILL a second later
        if not boundary and (drop_to is not None or userns):  # per-uid/namespace count
            lower(resource.RLIMIT_NPROC, 1 + max_processes + THREAD_ALLOWANCE)
        lower(resource.RLIMIT_AS, memory_mb << 20)  # last: later allocations could fail

    return preexec


def child_env(workdir: str) -> dict[str, str]:
    """Built from scratch: nothing of the caller's environment reaches the snippet."""
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
    env["PYTHONIOENCODING"] = "utf-8"  # informative only: -I ignores PYTHON* variables
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"  # BLAS thread pools would not fit RLIMIT_AS/RLIMIT_NPROC
    return env


def wait_exited(pid: int, timeout: float) -> bool:
    """Wait for ``pid`` to exit without reaping it (its pid, hence its group, stays ours)."""
    import math
    import select
    import time

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            poller = select.poll()
            poller.register(fd)
            return bool(poller.poll(max(0, math.ceil(timeout * 1000))))
        finally:
            os.close(fd)
    deadline = time.monotonic() + timeout
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def kill_group(pgid: int) -> None:
    """SIGKILL the snippet's whole process group (it is a session leader: pgid == pid)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, 9)


def remove_tree(path: str) -> None:
    import shutil
    import stat

    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):  # the snippet may have made directories unreadable
        os.chmod(path, 0o700)
        for dirpath, dirnames, _ in os.walk(path):
            for d in dirnames:
                full = os.path.join(dirpath, d)
                if stat.S_ISDIR(os.lstat(full).st_mode):
                    os.chmod(full, 0o700)
        shutil.rmtree(path, ignore_errors=True)


_PROBE = """import json, os
if os.path.exists('/proc/self/status'):
    status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
    mounts = {line.split()[4]: line.split()[5] for line in open('/proc/self/mountinfo')}
    info = {k: os.stat('/proc/self/ns/' + k).st_ino for k in ('net', 'user', 'pid')}
    info.update(seccomp=status['Seccomp'].strip(), ro=mounts['/'])
else:  # bubblewrap without /proc: it fails rather than start without its namespaces
    info = {}
open('probe', 'w').close()
info['shadow'] = os.path.exists('/etc/shadow')
print(json.dumps(info))
"""


def probe(command_for, preexec_for, drop: bool) -> dict[str, bool]:
    """Start an interpreter confined like a snippet and report the layers it ended up in.

    ``command_for(workdir, argv)`` is a context manager giving the launch (``.command``,
    ``.fds``: see ``_bubblewrap.Launch``) that runs ``argv`` (the interpreter's arguments).
    """
    import json
    import subprocess
    import tempfile

    parent = {k: os.stat(f"/proc/self/ns/{k}").st_ino for k in ("net", "user", "pid")}
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="llmrl-sandbox-probe-"))
    try:
        if drop:
            os.chown(workdir, NOBODY, NOBODY)
        with command_for(workdir, ["-I", "-B", "-c", _PROBE]) as launch:
            proc = subprocess.run(
                launch.command,
                cwd=workdir,
                env=child_env(workdir),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
                start_new_session=True,
                pass_fds=launch.fds,
                preexec_fn=preexec_for(workdir),
            )
    finally:
        remove_tree(workdir)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:].strip() or f"exit status {proc.returncode}")
    info = json.loads(proc.stdout)
    if "seccomp" not in info:  # no /proc: only bubblewrap starts it so, with every namespace
        return {"seccomp": True, "netns": True, "userns": True, "pidns": True, "proc": False,
                "readonly_fs": True, "host_files": info["shadow"]}  # fmt: skip
    return {
        "seccomp": info["seccomp"] == "2",
        "netns": info["net"] != parent["net"],
        "userns": info["user"] != parent["user"],
        "pidns": info["pid"] != parent["pid"],
        "proc": True,
        "readonly_fs": "ro" in info["ro"].split(","),
        "host_files": info["shadow"],
    }


# ------------------------------------------------------------------------------ child side
def read_roots() -> tuple[str, ...]:
    """Python's own install (so imports work) plus the time zone database, as real paths."""
    import sysconfig

    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    paths += [sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    paths.append("/usr/share/zoneinfo")
    found = {p for path in paths if path for p in (os.path.abspath(path), os.path.realpath(path))}
    return tuple(sorted(p for p in found if p != "/"))


def make_hook(root: str, readable: tuple[str, ...], allow_network: bool, max_processes: int):
    """The audit hook. It closes over immutable data and C callables only, and calls no
    helper functions, so neither monkeypatching (builtins, os, posixpath...) nor a frame
    taken from one of its own tracebacks can alter what it decides."""
    import _thread

    deny = ALWAYS_DENIED | (frozenset() if max_processes else PROCESS_EVENTS)
    deny |= frozenset() if allow_network else NETWORK_EVENTS
    deny_prefixes = ("ctypes.",) if allow_network else ("ctypes.", "socket.")
    blocked_modules, read_events, write_events = BLOCKED_MODULES, READ_EVENTS, WRITE_EVENTS
    module_prefixes = ("ctypes.", "_ctypes.", "cffi.")
    dev_rw, dev_ro = DEV_RW, DEV_RO
    me, main_thread, tmp = os.getpid(), _thread.get_ident(), root + "/"
    readable = tuple(r + "/" for r in readable)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    marker = MARKER.encode() + b" "
    emit, ident, getframe = os.write, _thread.get_ident, sys._getframe
    type_, issub, str_, bytes_, int_ = type, issubclass, str, bytes, int
    startswith, split, join, encode, decode = (
        str.startswith,
        str.split,
        str.join,
        str.encode,
        bytes.decode,
    )
    denied, not_importable, sandbox_error = PermissionError, ImportError, Exception

    def hook(event, args):
        bad = detail = None
        quiet = False
        try:
            if type_(event) is not str_:
                event = join("", (event,))
            paths, need, writing = (), 0, 0
            if event in deny or startswith(event, deny_prefixes):
                bad = event
            elif event == "import":
                name = args[0] if type_(args[0]) is str_ else join("", (args[0],))
                if name in blocked_modules or startswith(name, module_prefixes):
                    bad, detail = event, name
                    # Libraries probe optional imports (numpy tries ctypes): report only
                    # the snippet's own import statements as blocked.
                    quiet = getframe(1).f_code.co_filename != "main.py"
            elif event == "open":
                paths, mode, writing = args[:1], args[1], args[2] & write_flags
                need = 3 if mode is None else 1 if writing else 2  # 3: os.open (raw fds)
            elif event in read_events:
                paths, need = args[:1], 4
            elif event in write_events or event == "os.chdir":
                paths, need = (args[:2] if event == "os.rename" else args[:1]), 5
            elif event == "os.kill" or event == "os.killpg":
                bad = None if args[0] == me else event
            elif event == "signal.pthread_kill":
                bad = None if args[0] == ident() or args[0] == main_thread else event
            elif event == "resource.prlimit":
                bad = None if args[0] == 0 or args[0] == me else event
            for path in paths:
                t = type_(path)
                if path is None or issub(t, int_):  # the cwd, or a descriptor (all are ours)
                    continue
                if issub(t, str_):
                    p = path if t is str_ else join("", (path,))
                elif issub(t, bytes_):
                    p = decode(path, "utf-8", "surrogateescape")
                else:  # __fspath__ could answer differently to us than to the C function
                    bad, detail = event, f"path of type {t.__name__} (pass a str)"
                    break
                if not startswith(p, "/"):  # cwd and every directory fd are inside tmp
                    where = 0 if ".." in split(p, "/") else 1
                else:
                    parts = []
                    for c in split(p, "/"):
                        if c == "..":
                            if parts:
                                parts.pop()
                        elif c and c != ".":
                            parts.append(c)
                    n = "/" + join("/", parts)
                    where = (
                        1 if startswith(n + "/", tmp) else 3 if n in dev_rw
                        else 4 if n in dev_ro else 2 if startswith(n + "/", readable) else 0
                    )  # fmt: skip
                if event == "sqlite3.connect" and startswith(p, "file:"):
                    where = 0
                ok = (
                    where == 1 or where == 3 if need == 1 else where != 0 if need == 2
                    else where == 1 or where == 3 or (where == 4 and not writing) if need == 3
                    else where == 1 or where == 2 if need == 4 else where == 1
                )  # fmt: skip
                if not ok:
                    bad, detail = event, p
                    break
        except sandbox_error:  # malformed arguments: fail closed
            bad = event
        if bad is None:
            return
        try:  # noqa: SIM105 (contextlib would be a global lookup, i.e. patchable)
            quiet or emit(2, marker + encode(bad, "utf-8", "replace") + b"\n")
        except OSError:
            pass
        what = bad if detail is None else f"{bad} {detail!r}"
        raise (not_importable if bad == "import" else denied)(f"sandbox: {what} is not allowed")

    return hook


def accept_path_objects() -> None:
    """Let ``os`` functions take path objects again (pathlib calls ``os.mkdir(self)``...).

    The hook only accepts str/bytes paths, because a path object's ``__fspath__`` may answer
    differently when the hook asks than when the C function did. These wrappers convert
    first, so the C function and the hook see the same str. Pure convenience: calling the
    unwrapped functions with path objects is simply denied.
    """
    import functools

    fspath, path_like = os.fspath, os.PathLike

    def convert(value):
        return fspath(value) if isinstance(value, path_like) else value

    for name in PATH_FUNCTIONS:
        fn = getattr(os, name, None)
        if fn is None:
            continue

        def wrapper(*args, _fn=fn, **kwargs):
            return _fn(*map(convert, args), **{k: convert(v) for k, v in kwargs.items()})

        wrapper = functools.wraps(fn)(wrapper)
        setattr(os, name, wrapper)
        for supports in (os.supports_dir_fd, os.supports_fd, os.supports_follow_symlinks):
            if fn in supports:
                supports.add(wrapper)


def child_main(config: str) -> None:
    """Run inside the sandboxed interpreter: arm the guard, then run ``main.py`` as __main__."""
    import builtins
    import json
    import types

    cfg = json.loads(config)
    if cfg.get("nproc"):  # under bubblewrap: counts this sandbox's user namespace only
        import resource

        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        n = cfg["nproc"] if hard == resource.RLIM_INFINITY else min(cfg["nproc"], hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    root = os.path.realpath(cfg["root"])
    readable = read_roots()
    inside = tuple(r + "/" for r in readable)
    sys.path[:] = [p for p in sys.path if (os.path.realpath(p) + "/").startswith(inside)]
    if not cfg["max_processes"]:  # reached directly by multiprocessing, without an audit event

        def fork_exec(*args, _audit=sys.audit, **kwargs):
            _audit("_posixsubprocess.fork_exec")
            raise PermissionError("sandbox: process creation is not allowed")

        import _posixsubprocess

        _posixsubprocess.fork_exec = fork_exec
    accept_path_objects()
    with open("main.py", encoding="utf-8", errors="replace") as f:
        source = f.read()
    main = types.ModuleType("__main__")
    main.__file__, main.__builtins__ = "main.py", builtins
    sys.modules["__main__"], sys.argv = main, ["main.py"]
    sys.addaudithook(make_hook(root, readable, cfg["allow_network"], cfg["max_processes"]))
    try:
        exec(compile(source, "main.py", "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:  # print the traceback without this bootstrap's frame
        tb = exc.__traceback__
        exc = exc.with_traceback(tb.tb_next if tb is not None else None)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)


if __name__ == "__main__":  # as BOOTSTRAP runs it: python -c BOOTSTRAP <this source> <config>
    child_main(sys.argv[2])
