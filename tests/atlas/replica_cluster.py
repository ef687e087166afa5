"""A private PostgreSQL primary and its streaming replica, for the replica tests.

The tests' own server (the system one at ``DATABASE_URL``, or the embedded
one) is shared and must not be reconfigured, so this starts a throwaway pair
in a temporary folder on free ports: ``initdb`` a primary (``wal_level =
replica``, trust auth, a ``replication`` line in ``pg_hba.conf``), then
``pg_basebackup -R`` a hot standby from it. Binaries: the embedded server's
(the ``pgserver`` wheel), else the system's (``/usr/lib/postgresql/*/bin``).
PostgreSQL refuses to run as root, so under root the pair runs as ``postgres``
(or ``pgserver``). Durability is off (``fsync``): the pair lives for one test
module. :func:`start` returns None with the reason when it cannot run here.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

NEEDED = ("initdb", "pg_ctl", "pg_basebackup", "postgres")
_CONF = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sockets}'
wal_level = replica
max_wal_senders = 4
hot_standby = on
fsync = off
full_page_writes = off
max_connections = 40
shared_buffers = 32MB
"""


@dataclass
class Pair:
    root: Path
    bin: Path
    user: str | None
    primary_port: int
    replica_port: int

    def stop(self) -> None:
        for name in ("replica", "primary"):
            _run(
                self, "pg_ctl", "-D", str(self.root / name), "-m", "immediate", "stop", check=False
            )
        shutil.rmtree(self.root, ignore_errors=True)


def _binaries() -> Path | None:
    candidates: list[Path] = []
    try:
        from pgserver._commands import POSTGRES_BIN_PATH

        candidates.append(Path(POSTGRES_BIN_PATH))
    except Exception:  # noqa: BLE001 - the wheel is optional; the system's may do
        pass
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for path in candidates:
        if all(os.access(path / name, os.X_OK) for name in NEEDED):
            return path
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _user() -> tuple[str | None, str | None]:
    """(user to run as, or None for ourselves; reason when there is none)."""
    if os.geteuid() != 0:
        return None, None
    for name in ("postgres", "pgserver"):
        try:
            pwd.getpwnam(name)
            return name, None
        except KeyError:
            continue
    return None, "running as root and no 'postgres' or 'pgserver' user to run PostgreSQL as"


def _run(pair: Pair, tool: str, *args: str, check: bool = True) -> None:
    subprocess.run(
        [str(pair.bin / tool), *args],
        user=pair.user,
        check=check,
        capture_output=True,
        timeout=120,
        cwd=pair.root,
    )


def start() -> tuple[Pair | None, str]:
    """Start the pair; ``(pair, "")`` or ``(None, why not)``."""
    binaries = _binaries()
    if binaries is None:
        return None, "no PostgreSQL binaries with pg_basebackup (pgserver wheel or system)"
    user, why = _user()
    if why:
        return None, why
    root = Path(tempfile.mkdtemp(prefix="atlas-replica-"))
    if user:
        shutil.chown(root, user)
    pair = Pair(root, binaries, user, _free_port(), _free_port())
    try:
        primary, replica = root / "primary", root / "replica"
        _run(pair, "initdb", "-D", str(primary), "-U", "postgres", "--auth=trust", "--no-sync")
        with open(primary / "postgresql.conf", "a") as conf:
            conf.write(_CONF.format(port=pair.primary_port, sockets=root))
        with open(primary / "pg_hba.conf", "a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        _run(pair, "pg_ctl", "-D", str(primary), "-l", str(root / "primary.log"), "-w", "start")
        _run(
            pair,
            "pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(pair.primary_port), "-U", "postgres"),
            *("-D", str(replica), "-R", "-X", "stream", "-c", "fast", "--no-sync"),
        )
        with open(replica / "postgresql.conf", "a") as conf:
            conf.write(f"port = {pair.replica_port}\n")
        _run(pair, "pg_ctl", "-D", str(replica), "-l", str(root / "replica.log"), "-w", "start")
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        pair.stop()
        return None, f"could not start a primary and replica: {exc} {detail.decode()[-500:]}"
    return pair, ""
