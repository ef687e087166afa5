"""How long each migration that rewrites a log table takes at scale, and what it saves.

    .venv/bin/python bench/upgrade.py                        # 1M changesets
    .venv/bin/python bench/upgrade.py --changesets 20000     # a check

Migrations 0026-0029 (issue 16, "half the bytes") rewrite or reindex the log
tables of a database that may hold millions of rows; an operator needs to know
for how long, and what each one locks (docs/deploy.md, "Upgrading"). In one
throw-away database (``atlas_bench_upgrade``):

1. The scale benchmark's skewed log (``bench/scale_populate.py``) is inserted
   at the newest schema, then the migrations are reversed down to 0025, each
   reverse timed.
2. At 0025 the log is given what a real one holds there: 64 hex characters of
   hash and previous hash per changeset (placeholders of a real hash's size:
   the bench log has no chain) and a published journal entry per baseline
   changeset (what publishing left before 0026).
3. ``migrate`` forward one migration at a time, each timed, with every log
   table's bytes (heap, TOAST, indexes, over partitions) after a ``VACUUM``.

Writes its section of docs/benchmarks.md (``--doc``/``ATLAS_BENCH_DOC``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from _common import bench_env, header, parse_part_args, part_parser, table, write_json
from _setup import fresh_database, setup, write_section

TITLE = "Upgrading through migrations 0026-0029 at scale (issue 16, item 6)"
DB = os.environ.get("ATLAS_BENCH_DB") or "atlas_bench_upgrade"
START = "0025_revision_partitions"
STEPS = (
    ("0026_journal_published_gone", "published journal entries deleted in batches"),
    ("0027_hashes_bytea", "chain hashes as bytea (rewrites the changeset table)"),
    ("0028_leaner_log_indexes", "one seq-led revision index, branch index partial"),
    ("0029_revision_before_delta", "before image as undo (rewrites revision partitions)"),
)
TABLES = ("changesets_changeset", "changesets_revision", "changesets_journalentry")
# Step 2: what the log held at 0025 (by ALTER … USING: the log's guard refuses UPDATEs).
HEX_HASHES = (
    "ALTER TABLE changesets_changeset"
    " ALTER COLUMN prev_hash TYPE varchar(64) USING encode(sha256(int8send(seq - 1)), 'hex'),"
    " ALTER COLUMN hash TYPE varchar(64) USING encode(sha256(int8send(seq)), 'hex')"
)
PUBLISHED_JOURNAL = (
    "INSERT INTO changesets_journalentry (changeset_id, seq, phase, created_at, published_at,"
    " attempts, last_error, failures)"
    " SELECT id, seq, 'published', at, at, 1, '', 0 FROM changesets_changeset WHERE branch = ''"
)


def _bytes(cursor: Any) -> dict[str, int]:
    """Each log table's bytes on disk, summed over its partitions."""
    cursor.execute("VACUUM ANALYZE")
    out = {}
    for name in TABLES:
        cursor.execute(
            "SELECT GREATEST(pg_total_relation_size(%s::regclass),"
            " (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)"
            " FROM pg_partition_tree(%s::regclass)))::bigint",
            [name, name],
        )
        out[name] = int(cursor.fetchone()[0])
    return out


def _migrate(target: str) -> float:
    from django.core.management import call_command

    started = time.perf_counter()
    call_command("migrate", "changesets", target, verbosity=0)
    return time.perf_counter() - started


def _run(changesets: int) -> dict[str, Any]:
    import scale_populate as pop
    from django.db import connection

    with connection.cursor() as cursor:
        pop.populate(cursor, changesets)
        cursor.execute("SELECT count(*) FROM changesets_revision")
        revisions = cursor.fetchone()[0]
    reverse = {}
    for (name, _), (below, _) in zip(
        reversed(STEPS), [*reversed(STEPS[:-1]), (START, "")], strict=True
    ):
        reverse[name] = _migrate(below)
        print(f"  reversed {name}: {reverse[name]:.1f} s", flush=True)
    with connection.cursor() as cursor:
        cursor.execute(HEX_HASHES)
        cursor.execute(PUBLISHED_JOURNAL)
        sizes = {START: _bytes(cursor)}
    forward = {}
    for name, _ in STEPS:
        forward[name] = _migrate(name)
        with connection.cursor() as cursor:
            sizes[name] = _bytes(cursor)
        print(f"  applied {name}: {forward[name]:.1f} s", flush=True)
    return {
        "changesets": changesets,
        "revisions": revisions,
        "forward": forward,
        "reverse": reverse,
        "sizes": sizes,
    }


def _report(result: dict[str, Any], command: str) -> str:
    n, revisions = result["changesets"], result["revisions"]
    rows = []
    before = result["sizes"][START]
    for name, what in STEPS:
        after = result["sizes"][name]
        saved = sum(before.values()) - sum(after.values())
        rows.append(
            [f"`{name}`", what, f"{result['forward'][name]:.1f}", f"{result['reverse'][name]:.1f}",
             *(f"{after[t] / 1e6:,.0f}" for t in TABLES), f"{saved / 1e6:,.0f}"]
        )  # fmt: skip
        before = after
    start = result["sizes"][START]
    sizes = [f"{start[t] / 1e6:,.0f}" for t in TABLES]
    first = [f"`{START}`", "the log as it was", "", "", *sizes, ""]
    lines = [
        header(command),
        "",
        f"{n:,} changesets and {revisions:,} revisions of `bench/scale_populate.py`'s skewed log,"
        " taken down to 0025 (each reverse timed), given what a log held there (hex hashes,"
        " a published journal entry per baseline changeset), then migrated up one step at a"
        " time. Seconds of `migrate`; bytes on disk (heap, TOAST, indexes, every partition)"
        ' after a `VACUUM`, in MB. What each one locks: docs/deploy.md, "Upgrading".',
        "",
        table(
            [
                "migration",
                "what",
                "forward s",
                "reverse s",
                "changesets MB",
                "revisions MB",
                "journal MB",
                "saved MB",
            ],
            [first, *rows],
        ),  # fmt: skip
    ]
    return "\n".join(lines)


def main() -> None:
    parser = part_parser(__doc__, smoke=None)
    parser.add_argument("--changesets", type=int, default=1_000_000)
    args = parse_part_args(parser)
    bench_env()
    fresh_database(DB)
    setup(database=DB)
    result = _run(args.changesets)
    command = "bench/upgrade.py" + (
        f" --changesets {args.changesets}" if args.changesets != 1_000_000 else ""
    )
    section = _report(result, command)
    write_section(TITLE, section)
    print(section)
    write_json(args.json, result)


if __name__ == "__main__":
    main()
