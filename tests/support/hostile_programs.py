"""Hostile Python programs: the texts shared by the sandbox's own table
(``tests/envs/test_sandbox_containment.py``) and the end-to-end env suite
(``test_sandbox_hostile.py``).

A program may name what its test provides through placeholders, filled by :func:`fill`:

* ``@PORT@``: a TCP port the test listens on (nothing may connect to it);
* ``@ESCAPE@``: an absolute path outside the sandbox that must never be created;
* ``@OUTSIDE@``: an absolute path outside the sandbox to a file holding a secret;
* ``@SECRET@``: the name of an environment variable of the caller holding a secret;
* ``@MARKER@``: a unique string the program puts on the command line of what it starts;
* ``@OUTSIDEDB@``: an absolute path outside the sandbox to an SQLite database holding a secret;
* ``@SHM@``: the name of a POSIX shared-memory segment the caller created, holding a secret;
* ``@CALLER@``: the caller's pid (as the machine sees it).
"""

from __future__ import annotations

import re

_PLACEHOLDER = re.compile(r"@([A-Z]+)@")

# Tries each named attempt and prints ``<name> allowed`` or ``<name> denied <exception>``.
_ATTEMPTS = (
    "for name, attempt in attempts.items():\n"
    "    try:\n"
    "        attempt()\n"
    "        print(name, 'allowed')\n"
    "    except Exception as e:\n"
    "        print(name, 'denied', type(e).__name__)\n"
)

# Modules that open files in C, below the audit hook: only the operating-system boundary
# (bubblewrap) contains them. Each attempt prints ``<name> got <what it got>`` or a denial.
_BELOW_THE_HOOK = """import os, mmap, pwd, readline, sqlite3, _posixshmem

def read(path):  # readline's history file: a C-level read of any text file
    readline.clear_history()
    readline.read_history_file(path)
    n = readline.get_current_history_length()
    return '|'.join(readline.get_history_item(i) or '' for i in range(1, n + 1))

def shadow():
    import spwd
    return [p.sp_namp for p in spwd.getspall()]

def shm():
    fd = _posixshmem.shm_open('@SHM@', os.O_RDONLY, 0)
    return mmap.mmap(fd, 0, prot=mmap.PROT_READ)[:80]

def inherited():
    found = []
    for fd in range(3, 64):
        try:
            os.fstat(fd)
            found.append(fd)
        except OSError:
            pass
    return found

db = sqlite3.connect(':memory:')
attempts = {
    'readline-outside': lambda: read('@OUTSIDE@'),
    'readline-shadow': lambda: read('/etc/shadow'),
    'readline-caller-environ': lambda: read('/proc/@CALLER@/environ'),
    'readline-proc-self-root': lambda: read('/proc/self/root@OUTSIDE@'),
    'readline-proc-1-root': lambda: read('/proc/1/root@OUTSIDE@'),
    'readline-dotdot': lambda: read('../' * 30 + '@OUTSIDE@'.lstrip('/')),
    'readline-write-outside': lambda: readline.write_history_file('@ESCAPE@'),
    'readline-append-outside': lambda: readline.append_history_file(1, '@OUTSIDE@'),
    'sqlite-attach': lambda: db.execute("attach '@OUTSIDEDB@' as o").execute(
        'select * from o.t').fetchall(),
    'sqlite-vacuum-into': lambda: db.execute("vacuum into '@ESCAPE@'").fetchall(),
    'pwd': lambda: [p.pw_name for p in pwd.getpwall()],
    'spwd': shadow,
    'shm-open': shm,
    'inherited-fds': inherited,
    'environ': lambda: sorted(os.environ),
}
for name, attempt in attempts.items():
    try:
        print(name, 'got', repr(attempt())[:300])
    except Exception as e:
        print(name, 'denied', type(e).__name__)
"""

PROGRAMS: dict[str, str] = {
    "below-the-audit-hook": _BELOW_THE_HOOK,
    "infinite-loop": "while True:\n    pass",
    "fork-bomb": "import os\nwhile True:\n    os.fork()",
    "memory-bomb": "x = bytearray(10**10)",
    "growing-list": "x = []\nwhile True:\n    x.append(bytearray(10**7))",
    "huge-print": "print('x' * 10**8)",
    "print-loop": "while True:\n    print('spam ' * 20)",
    "disk-bomb": "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * 2**20)",
    "fd-exhaustion": "files = [open(__file__) for _ in range(10**5)]",
    "thread-bomb": (
        "import threading, time\n"
        "while True:\n"
        "    threading.Thread(target=time.sleep, args=(300,), daemon=True).start()"
    ),
    "socket-connect": "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', @PORT@))",
    "urlopen": (
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:@PORT@/', timeout=1)"
    ),
    "read-etc-passwd": "print(open('/etc/passwd').read())",
    "read-outside-file": "print(open('@OUTSIDE@').read())",
    "read-outside-file-dotdot": (
        "import os\nprint(open('../' * 30 + '@OUTSIDE@'.lstrip('/')).read())"
    ),
    "write-outside": "open('@ESCAPE@', 'w').write('pwned')",
    "write-outside-every-way": (
        "import os, pathlib, shutil, sqlite3\n"
        "def rename():\n"
        "    open('x', 'w').close()\n"
        "    os.rename('x', '@ESCAPE@')\n"
        "attempts = {\n"
        "    'open': lambda: open('@ESCAPE@', 'w').write('pwned'),\n"
        "    'os.open': lambda: os.open('@ESCAPE@', os.O_WRONLY | os.O_CREAT),\n"
        "    'pathlib': lambda: pathlib.Path('@ESCAPE@').write_text('pwned'),\n"
        "    'rename': rename,\n"
        "    'copy': lambda: shutil.copy(__file__, '@ESCAPE@'),\n"
        "    'mkdir': lambda: os.mkdir('@ESCAPE@'),\n"
        "    'sqlite': lambda: sqlite3.connect('@ESCAPE@').execute('create table t (x)'),\n"
        "    'dotdot': lambda: open('../' * 30 + '@ESCAPE@'.lstrip('/'), 'w'),\n"
        "}\n" + _ATTEMPTS
    ),
    "secret-env": (
        "import os\nprint(os.environ.get('@SECRET@', 'absent'))\nprint(sorted(os.environ))"
    ),
    "read-parent-environ": ("import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())"),
    "kill-parent": "import os\nos.kill(os.getppid(), 9)",
    "signal-parent-every-way": (
        "import os, signal\n"
        "parent = os.getppid()\n"
        "attempts = {\n"
        "    'kill': lambda: os.kill(parent, signal.SIGUSR1),\n"
        "    'killpg': lambda: os.killpg(os.getpgid(parent), signal.SIGUSR1),\n"
        "    'pidfd': lambda: signal.pidfd_send_signal(os.pidfd_open(parent), signal.SIGUSR1),\n"
        "}\n" + _ATTEMPTS + "os.kill(parent, signal.SIGKILL)\n"
    ),
    "prlimit-parent": (
        "import os, resource\nresource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (0, 0))"
    ),
    "signal-shenanigans": (
        "import signal\nfor s in (signal.SIGTERM, signal.SIGXCPU, signal.SIGINT):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGALRM, lambda *a: None)\nsignal.alarm(1)\nwhile True:\n    pass"
    ),
    "import-ctypes": "import ctypes\nctypes.CDLL(None)",
    "ctypes-kill-parent": "import ctypes, os\nctypes.CDLL(None).kill(os.getppid(), 9)",
    "load-ctypes-behind-import": (
        "import importlib.util as u\nspec = u.find_spec('_ctypes')\n"
        "u.module_from_spec(spec).dlopen(None)"
    ),
    "deep-recursion": (  # C-level recursion past the stack: SIGSEGV, the caller is fine
        "import json, sys\nsys.setrecursionlimit(10**6)\njson.loads('[' * 10**6 + ']' * 10**6)"
    ),
    "deep-python-recursion": "def f(n):\n    return f(n + 1)\n\nf(0)",
    "subprocess-with-marker": (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '@MARKER@'])\n"
        "print('started', p.pid)"
    ),
    "zombie-children": (
        "import os, time\n"
        "for _ in range(5):\n"
        "    if os.fork() == 0:\n"
        "        os._exit(0)\n"
        "print('zombies made', flush=True)\n"
        "time.sleep(300)"
    ),
    "daemonize": (  # double fork, new session, exec: an orphan that outlives its parent
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    try:\n"
        "        os.setsid()\n"
        "    except OSError as e:\n"
        "        print('setsid denied', e.errno, flush=True)\n"
        "    if os.fork() == 0:\n"
        "        os.execv(sys.executable,\n"
        "                 [sys.executable, '-c', 'import time; time.sleep(300)', '@MARKER@'])\n"
        "    os._exit(0)\n"
        "time.sleep(1)\n"
        "print('daemon started')"
    ),
}


def fill(code: str, **values: object) -> str:
    """``code`` with each ``@NAME@`` replaced by ``values[name.lower()]``.

    Raises:
        KeyError: a placeholder of ``code`` has no value.
    """

    def value(match: re.Match[str]) -> str:
        name = match[1].lower()
        if name not in values:
            raise KeyError(f"no value for the placeholder {match[0]} (pass {name}=...)")
        return str(values[name])

    return _PLACEHOLDER.sub(value, code)
