"""A throwaway PostgreSQL cluster for the services tests (``tests/services``).

Debian's ``postgresql`` package (``make test`` installs it as root, like bubblewrap): ``initdb``
in a fresh temporary folder, ``postgres`` on a free port of 127.0.0.1 with password
(scram-sha-256) authentication, as a cluster's database service would require, and everything
deleted afterwards. PostgreSQL refuses to run as root: under root the binaries run as the
package's ``postgres`` account (``runuser``), which owns the folder.

:func:`missing_reason` says why a cluster cannot start here (the tests skip with it).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.service_process import free_port

OS_ACCOUNT = "postgres"
"""The account Debian's package creates; the server runs as it when the tests run as root."""


def bindir() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: on ``PATH``, else Debian's
    ``/usr/lib/postgresql/<version>/bin`` (newest version), else None."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    return versions[-1].parent if versions else None


def missing_reason() -> str | None:
    """Why no cluster can start on this machine, or None when one can."""
    if bindir() is None:
        return (
            "PostgreSQL's server binaries (initdb, pg_ctl) are missing: `make test` installs "
            "Debian's postgresql package as root; else apt-get install postgresql"
        )
    if shutil.which("psql") is None:
        return "psql is missing (Debian package postgresql-client)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(OS_ACCOUNT)
        except KeyError:
            return f"running as root, and there is no '{OS_ACCOUNT}' account to run the server as"
        if shutil.which("runuser") is None:
            return "running as root, and runuser (util-linux) is missing"
    return None


class PostgresCluster:
    """One ``initdb`` cluster: superuser ``user`` with a random password, listening on
    127.0.0.1:``port`` only. :meth:`stop` / :meth:`start` keep its data (a database restart);
    :meth:`destroy` stops it and deletes the folder."""

    def __init__(self, user: str = "llmrl") -> None:
        self.bin = bindir()
        if self.bin is None:
            raise RuntimeError(missing_reason())
        self.user = user
        self.password = secrets.token_hex(12)  # hex: nothing to escape in a URI
        self.host = "127.0.0.1"
        self.port = free_port()
        # a folder the server's account can enter (pytest's tmp folders are private to root)
        self.root = Path(tempfile.mkdtemp(prefix="llmrl-postgres-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            account = pwd.getpwnam(OS_ACCOUNT)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        password_file = self.root / "password"
        password_file.write_text(self.password + "\n")
        if self._as_root:
            os.chown(password_file, account.pw_uid, account.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-U", user, f"--pwfile={password_file}",
            "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C",
            "--no-instructions",
        )  # fmt: skip
        password_file.unlink()

    def _run(self, tool: str, *args: str, timeout: float = 120.0) -> str:
        argv = [str(self.bin / tool), *args]
        if self._as_root:
            argv = ["runuser", "-u", OS_ACCOUNT, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
                f"\n{self.log_tail()}"
            )
        return done.stdout

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses={self.host}"
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log_path), "-w",
            "-t", "60", "start",
        )  # fmt: skip

    def stop(self) -> None:
        """Stop the server (``-m fast``: open connections are cut, as in a database restart)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def restart(self) -> None:
        """Stop the server and start it again on the same port and data."""
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        """Whether the server is up (``pg_ctl status``)."""
        try:
            self._run("pg_ctl", "-D", str(self.data), "status")
        except RuntimeError:
            return False
        return True

    def psql(self, sql: str, database: str = "postgres") -> str:
        """The result of ``sql`` (unaligned, tuples only), over TCP with the password."""
        done = subprocess.run(
            ["psql", "-h", self.host, "-p", str(self.port), "-U", self.user, "-d", database,
             "-v", "ON_ERROR_STOP=1", "-tA", "-c", sql],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PGPASSWORD": self.password},
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"psql {sql!r} on {database}: {done.stderr.strip()}")
        return done.stdout.strip()

    def create_database(self, name: str) -> None:
        """``CREATE DATABASE name`` (owned by the superuser)."""
        self.psql(f'CREATE DATABASE "{name}"')

    def version(self) -> str:
        """The server's version string, e.g. ``15.18 (Debian 15.18-0+deb12u1)``."""
        return self.psql("SHOW server_version")

    def destroy(self) -> None:
        """Stop the server when it runs and delete its folder."""
        if self.data.exists() and self.running:
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, n: int = 3000) -> str:
        """The last ``n`` characters of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""
