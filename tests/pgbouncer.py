"""A real PgBouncer in ``pool_mode = transaction`` in front of the test database.

Debian's ``pgbouncer`` package (``make pgbouncer`` installs it when missing);
without the binary the tests that need it skip with that reason. No system
service is used: each fixture starts its own process with an ini file in a
temporary folder, trust authentication (an ``auth_file`` naming the test
database's user), listening on a free loopback port and passing everything
to the server the test database lives on: a TCP host and port
(``DATABASE_URL``) or the embedded server's socket folder
(``atlas/embedded.py``; its ``host`` is a path in ``OPTIONS``).

PgBouncer refuses to run as root; as root (CI) it runs as the owner of the
socket folder it must reach, or ``nobody`` for a TCP server.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

BINARY_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
MISSING = (
    "PgBouncer is not installed: the transaction-pooling tests are SKIPPED"
    " (`make pgbouncer` installs Debian's package as root)"
)
LOOPBACK = "127.0.0.1"
# Fewer server connections than the live server has threads: transactions of
# different clients really do share sessions.
POOL_SIZE = 4


def binary() -> str | None:
    found = shutil.which("pgbouncer")
    return found or next((p for p in BINARY_PATHS if os.access(p, os.X_OK)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _server_of(settings_dict: dict[str, Any]) -> tuple[str, str]:
    options = settings_dict.get("OPTIONS") or {}
    host = settings_dict.get("HOST") or options.get("host") or LOOPBACK
    port = str(settings_dict.get("PORT") or options.get("port") or 5432)
    return host, port


def _run_as(host: str) -> str | None:
    """The user PgBouncer drops to when we are root (it will not run as root)."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):
        owner = os.stat(host).st_uid
        if owner != 0:
            return pwd.getpwuid(owner).pw_name
    return "nobody"


@dataclass
class PgBouncer:
    """One PgBouncer process; ``url()`` reaches the test database through it."""

    settings_dict: dict[str, Any]
    port: int = field(default_factory=free_port)
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="atlas-pgb-")))
    process: subprocess.Popen | None = None

    @property
    def user(self) -> str:
        return self.settings_dict.get("USER") or "postgres"

    @property
    def dbname(self) -> str:
        return self.settings_dict["NAME"]

    def url(self, dbname: str | None = None) -> str:
        password = self.settings_dict.get("PASSWORD") or ""
        credentials = quote(self.user) + (f":{quote(password)}" if password else "")
        return f"postgresql://{credentials}@{LOOPBACK}:{self.port}/{quote(dbname or self.dbname)}"

    def ini(self) -> str:
        host, port = _server_of(self.settings_dict)
        target = f"host={host} port={port} dbname={self.dbname}"
        return "\n".join(
            [
                "[databases]",
                f"{self.dbname} = {target}",
                # One server connection: the witness that server-side prepared
                # statements do not survive transaction pooling (test_pooling.py).
                f"single = {target} pool_size=1",
                "[pgbouncer]",
                f"listen_addr = {LOOPBACK}",
                f"listen_port = {self.port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {self.folder / 'users.txt'}",
                f"admin_users = {self.user}",
                "pool_mode = transaction",
                f"default_pool_size = {POOL_SIZE}",
                "max_client_conn = 500",
                # What ATLAS_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS does without a pooler.
                "idle_transaction_timeout = 60",
                f"logfile = {self.folder / 'pgbouncer.log'}",
                f"pidfile = {self.folder / 'pgbouncer.pid'}",
                "",
            ]
        )

    def start(self) -> PgBouncer:
        executable = binary()
        if executable is None:
            pytest.skip(MISSING)
        password = self.settings_dict.get("PASSWORD") or ""
        (self.folder / "users.txt").write_text(f'"{self.user}" "{password}"\n')
        (self.folder / "pgbouncer.ini").write_text(self.ini())
        argv = [executable, str(self.folder / "pgbouncer.ini")]
        host, _ = _server_of(self.settings_dict)
        run_as = _run_as(host)
        if run_as is not None:
            entry = pwd.getpwnam(run_as)
            for path in (self.folder, *self.folder.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            argv[1:1] = ["-u", run_as]
        with open(self.folder / "stdout.log", "wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            assert self.process.poll() is None, self.log()
            with contextlib.suppress(psycopg.OperationalError):
                psycopg.connect(self.url(), connect_timeout=2).close()
                return self
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.1)

    def admin(self, command: str) -> list[dict[str, Any]]:
        """Rows of a console command (``SHOW POOLS``, ``SHOW CONFIG``) as dicts."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True) as conn:
            cursor = conn.execute(command, prepare=False)
            names = [c.name for c in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def log(self) -> str:
        parts = [self.folder / "stdout.log", self.folder / "pgbouncer.log"]
        return "\n".join(p.read_text(errors="replace") for p in parts if p.exists())

    def stop(self) -> None:
        """Stop at once (SIGTERM: its server connections close with it)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(20)
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def running(settings_dict: dict[str, Any]) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(dict(settings_dict)).start()
    try:
        yield bouncer
    finally:
        bouncer.stop()
