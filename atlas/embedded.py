"""The embedded, project-local PostgreSQL used when ``DATABASE_URL`` is unset.

Why: a new user should get a working Atlas with one command on a machine that
runs no database server and where they have no root. The ``pgserver`` wheel
ships PostgreSQL binaries; we keep the cluster in ``.atlas/pgdata`` (git-ignored)
and leave it running between commands so that ``manage.py`` invocations, the
dev server, the Celery worker and the test run all share it. Starting is
idempotent and takes an inter-process lock, so several processes may race here.

``python -m atlas.embedded start|stop|url|status`` drives it from the Makefile.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

# pgserver's lock directory falls back to /tmp when XDG_RUNTIME_DIR is unset
# (as under root); that is fine, so keep it quiet.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("ATLAS_STATE_DIR", BASE_DIR / ".atlas"))
PGDATA = STATE_DIR / "pgdata"


def database_url() -> str:
    """Start the embedded cluster if needed and return a libpq URL for it."""
    import pgserver  # imported lazily: production images need not install it

    STATE_DIR.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(PGDATA, cleanup_mode=None)
    return server.get_uri()


def stop() -> None:
    """Stop the embedded cluster (a no-op when it is not running)."""
    import subprocess

    if not (PGDATA / "postmaster.pid").exists():
        return
    from pgserver._commands import POSTGRES_BIN_PATH

    cmd = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(PGDATA), "-m", "fast", "-w", "stop"]
    if os.geteuid() == 0:  # the cluster belongs to pgserver's unprivileged user
        cmd = ["su", "pgserver", "-s", "/bin/sh", "-c", " ".join(cmd)]
    subprocess.run(cmd, check=False)


def main(argv: list[str]) -> int:
    action = argv[1] if len(argv) > 1 else "url"
    if action in ("start", "url"):
        print(database_url())
    elif action == "stop":
        stop()
    elif action == "status":
        running = (PGDATA / "postmaster.pid").exists()
        print(f"embedded PostgreSQL in {PGDATA}: {'running' if running else 'stopped'}")
    else:
        print("usage: python -m atlas.embedded [start|url|stop|status]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
