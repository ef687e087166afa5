"""How long migration 0027 (chain hashes as bytea) holds the changeset table, at scale.

    .venv/bin/python bench/hashes_bytea.py                       # 1M changesets
    .venv/bin/python bench/hashes_bytea.py --changesets 20000    # a check

In one throw-away database (``atlas_bench_hashes``):

1. The scale benchmark's skewed log (``bench/scale_populate.py``) is inserted.
2. Migration 0027 is reversed, and each changeset given 64 hex characters of
   hash and of previous hash (placeholders of a real hash's size: the bench log
   has no chain), so the table is what every log before 0027 holds.
3. ``migrate changesets 0027_hashes_bytea`` is timed (the ACCESS EXCLUSIVE
   rewrite an upgrade runs), then its reverse, then it again; the changeset
   table's bytes (heap, TOAST, indexes) are read before and after.

Prints the figures (docs/deploy.md, "Upgrading", quotes them); writes no doc.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from _common import bench_env
from _setup import database_url, setup

DB = os.environ.get("ATLAS_BENCH_DB") or "atlas_bench_hashes"
BEFORE = "0026_journal_published_gone"
MIGRATION = "0027_hashes_bytea"
# Step 2: hex text as the old write path left it (placeholders: sha256 of the seq).
HEX_HASHES = (
    "ALTER TABLE changesets_changeset"
    " ALTER COLUMN prev_hash TYPE varchar(64) USING encode(sha256(int8send(seq - 1)), 'hex'),"
    " ALTER COLUMN hash TYPE varchar(64) USING encode(sha256(int8send(seq)), 'hex')"
)


def _fresh_database() -> None:
    import psycopg
    from _setup import server_url

    admin = urlunsplit(urlsplit(server_url())._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    database_url(DB)


def _bytes(cursor: Any) -> int:
    cursor.execute("SELECT pg_total_relation_size('changesets_changeset')")
    return int(cursor.fetchone()[0])


def _migrate(target: str) -> float:
    from django.core.management import call_command

    started = time.perf_counter()
    call_command("migrate", "changesets", target, verbosity=0)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changesets", type=int, default=1_000_000)
    args = parser.parse_args()
    bench_env()
    _fresh_database()
    setup(database=DB)
    import scale_populate as pop
    from django.db import connection

    with connection.cursor() as cursor:
        pop.populate(cursor, args.changesets)
    _migrate(BEFORE)
    with connection.cursor() as cursor:
        cursor.execute(HEX_HASHES)
        cursor.execute("VACUUM ANALYZE changesets_changeset")
        hex_bytes = _bytes(cursor)
    forward = _migrate(MIGRATION)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE changesets_changeset")
        bytea_bytes = _bytes(cursor)
        cursor.execute("SELECT count(*), sum(octet_length(hash)) FROM changesets_changeset")
        count, hash_bytes = cursor.fetchone()
    assert hash_bytes == 32 * count, (count, hash_bytes)
    reverse = _migrate(BEFORE)
    again = _migrate(MIGRATION)
    print(
        f"{count:,} changesets: 0027 forward {forward:.1f} s (again {again:.1f} s),"
        f" reverse {reverse:.1f} s; changeset table with indexes {hex_bytes / 1e6:,.0f} MB"
        f" → {bytea_bytes / 1e6:,.0f} MB ({(hex_bytes - bytea_bytes) / count:.0f} B/changeset)"
    )


if __name__ == "__main__":
    main()
