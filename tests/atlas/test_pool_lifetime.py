"""``ATLAS_DB_POOL_MAX_LIFETIME_SECONDS``: the pool a process opens replaces its
connections after that long, which also bounds how long a prepared statement's
plan outlives its table's statistics (docs/deploy.md, "Table statistics and
prepared plans")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.changesets.worker_helpers import database_url_for_workers

BASE_DIR = Path(__file__).resolve().parents[2]
# The pool Django opens in the child, as psycopg_pool holds it.
PROBE = (
    "import django; django.setup();"
    "from django.db import connection; connection.ensure_connection();"
    "print(connection.pool.max_lifetime)"
)


def _pool_max_lifetime(**env: str) -> float:
    child = {
        **os.environ,
        "DATABASE_URL": database_url_for_workers(),
        "DJANGO_SETTINGS_MODULE": "atlas.settings",
        "ATLAS_DB_POOL": "1",
        "ATLAS_DB_POOL_MIN_SIZE": "1",
        **env,
    }
    if "ATLAS_DB_POOL_MAX_LIFETIME_SECONDS" not in env:
        child.pop("ATLAS_DB_POOL_MAX_LIFETIME_SECONDS", None)
    run = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=BASE_DIR,
        env=child,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return float(run.stdout.strip().splitlines()[-1])


@pytest.mark.django_db
def test_the_pool_replaces_its_connections_after_ten_minutes_unless_told():
    assert _pool_max_lifetime() == 600.0
    assert _pool_max_lifetime(ATLAS_DB_POOL_MAX_LIFETIME_SECONDS="90") == 90.0
