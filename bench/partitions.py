"""Reads and the archive cut's removal on plain log tables vs N partitions (issue 21).

    .venv/bin/python bench/partitions.py                       # ~1M revisions, 10 partitions
    .venv/bin/python bench/partitions.py --changesets 7900000 --partitions 10  # ~10M
    .venv/bin/python bench/partitions.py --smoke               # CI size, scratch output

What it does, in one throw-away database (``atlas_bench_partitions``):

1. The scale benchmark's skewed log (``bench/scale_populate.py``) is inserted in SQL
   onto ``--partitions`` partitions of equal width of both log tables, the
   revisions and the changesets (``changesets.partitions``).
2. **Reads, partitioned**: the entity history page (the busiest key and a quiet
   one), an as-of page in the middle of the log, a feed page in the middle,
   blame, and ``/revisions?namespace=&key=``, through the API in-process,
   warm, the median of repeated runs.
3. The rows are moved into plain tables (migrations 0025's and 0038's reverse,
   ``changesets.repartition``) and the same reads are timed again.
4. **The removal, by DELETE** (plain tables): a signed, switched cut is
   recorded through 90% of the log (the end of partition 9 of 10) and
   ``hot.remove_through`` removes everything through it in batches, timed; the
   hot tables' bytes on disk before and after (no VACUUM FULL: what DELETE
   leaves). The rows are put back from a copy, the tables moved onto
   partitions again, and
5. **the removal, by partition drop**: the same cut, timed, bytes before/after.

Only the removal step differs between the two; writing and verifying the
segments is the same work either way (``bench/archive.py`` measures it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from _common import bench_env, header, parse_part_args, part_parser, repeat_ms, table, write_json
from _setup import fresh_database, setup, write_section

TITLE = "Log partitions: revisions and changesets (issue 21, migration 0038)"
DB = os.environ.get("ATLAS_BENCH_DB") or "atlas_bench_partitions"
TABLES = ("changesets_changeset", "changesets_revision", "changesets_journalentry")


def _layout(changesets: int, count: int) -> int:
    """The empty log tables on ``count`` partitions covering the log; the width."""
    from changesets import partitions, repartition

    width = max(changesets // count, 1)
    repartition.lay_out(partitions.missing(0, changesets + 1, [], step=width))
    return width


def populate(changesets: int, count: int) -> dict[str, Any]:
    import scale_populate as pop
    from django.db import connection

    width = _layout(changesets, count)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        pop.populate(cursor, changesets)
        cursor.execute("DELETE FROM changesets_journalentry")  # published, as the relay would
        cursor.execute("VACUUM ANALYZE")
        cursor.execute("SELECT count(*) FROM changesets_revision")
        revisions = cursor.fetchone()[0]
    return {"seconds": time.perf_counter() - started, "width": width, "revisions": revisions}


def _pages() -> dict[str, str]:
    """The pages to time: label → URL (keys picked from the log itself)."""
    from django.db import connection

    from changesets.selectors.feed import cursor_encode

    with connection.cursor() as cursor:
        cursor.execute("SELECT max(seq) FROM changesets_changeset")
        head = cursor.fetchone()[0]
        cursor.execute(
            "SELECT namespace, kind, slug FROM changesets_revision WHERE branch = ''"
            " AND seq > %s GROUP BY 1, 2, 3 ORDER BY count(*) DESC LIMIT 1",
            [head - 20_000],
        )
        busy = "/".join(cursor.fetchone())
        cursor.execute(
            "SELECT namespace, kind, slug FROM changesets_revision WHERE branch = ''"
            " AND seq BETWEEN %s AND %s ORDER BY seq LIMIT 1",
            [head // 3, head // 3 + 1000],
        )
        quiet_ns, quiet_kind, quiet_slug = cursor.fetchone()
        cursor.execute("SELECT id FROM changesets_changeset WHERE seq = %s", [head // 2])
        middle = cursor.fetchone()[0]
    quiet = f"{quiet_ns}/{quiet_kind}/{quiet_slug}"
    return {
        "history page (busiest key)": f"/api/v1/entities/{busy}/history?page_size=50",
        "history page (a quiet key)": f"/api/v1/entities/{quiet}/history?page_size=50",
        "as-of page (middle of the log)": f"/api/v1/entities?namespace={quiet_ns}"
        f"&as_of={middle}&page_size=50",
        "feed page (middle of the log)": f"/api/v1/changes?since={cursor_encode(head // 2)}"
        "&limit=100",
        "blame (busiest key)": f"/api/v1/entities/{busy}/blame",
        "/revisions?namespace=&key=": f"/api/v1/revisions?namespace={quiet_ns}&key=/price"
        "&page_size=50",
    }


def time_reads(pages: dict[str, str], runs: int) -> dict[str, float]:
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    user = get_user_model().objects.filter(is_superuser=True).first()
    if user is None:
        user = get_user_model().objects.create_superuser("bench", "bench@example.test", "x")
    client = APIClient()
    client.force_authenticate(user)
    out = {}
    for label, url in pages.items():

        def get(url: str = url) -> None:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code, response.content)

        out[label] = statistics.median(repeat_ms(get, runs, seconds=20, warm=2))
    return out


def _bytes() -> int:
    from django.db import connection

    total = 0
    with connection.cursor() as cursor:
        for name in TABLES:
            cursor.execute(  # a partitioned table has no storage: its partitions do
                "SELECT sum(pg_total_relation_size(r))::bigint"
                " FROM (SELECT %s::regclass AS r UNION ALL"
                " SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = %s::regclass) p",
                [name, name],
            )
            total += int(cursor.fetchone()[0] or 0)
    return total


def _record_cut(through: int) -> None:
    """A signed, switched cut through ``through`` (what the archiver leaves before removal)."""
    from django.db import connection
    from django.utils import timezone

    from changesets.archive.models import ArchiveCut, CutState

    with connection.cursor() as cursor:
        cursor.execute(  # the hash as the cut keeps it: hex text ('' for a placeholder)
            "SELECT COALESCE(encode(hash, 'hex'), ''), at, id FROM changesets_changeset"
            " WHERE seq = %s",
            [through],
        )
        hash_, at, max_id = cursor.fetchone()
    ArchiveCut.objects.all().delete()
    ArchiveCut.objects.create(
        seq=through, from_seq=1, prev_hash="0" * 64, hash=hash_, at=at,
        max_changeset_id=max_id, changesets=through, revisions=0, state=CutState.SWITCHED,
        signature="bench", location="bench", requested_by="bench", created_at=timezone.now(),
    )  # fmt: skip


def time_removal(through: int) -> dict[str, float]:
    from changesets.archive import hot

    _record_cut(through)
    before = _bytes()
    started = time.perf_counter()
    removed = hot.remove_through(through)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "revisions": removed,
        "bytes_before": before,
        "bytes_after": _bytes(),
    }


def _copy_out(through: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for name in TABLES:
            cursor.execute(f"DROP TABLE IF EXISTS bench_copy_{name}")
            cursor.execute(
                f"CREATE TABLE bench_copy_{name} AS SELECT * FROM {name} WHERE seq <= %s",
                [through],
            )


def _copy_back() -> None:
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cursor:
        # The rows left these tables a moment ago: no key checks (as in the populate).
        cursor.execute("SET LOCAL session_replication_role = replica")
        for name in TABLES:
            cursor.execute(f"INSERT INTO {name} SELECT * FROM bench_copy_{name}")
            cursor.execute(f"DROP TABLE bench_copy_{name}")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def _move(*, partitioned: bool, width: int) -> float:
    from django.db import connection, transaction

    from changesets import repartition

    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        # Both log tables (the changeset table since migration 0038), referenced first.
        if partitioned:
            repartition.changesets_to_partitioned(cursor, progress=False, width=width, ahead=1)
            repartition.to_partitioned(cursor, progress=False, width=width, ahead=1)
        else:
            repartition.to_plain(cursor, progress=False)
            repartition.changesets_to_plain(cursor, progress=False)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE changesets_revision")
        cursor.execute("VACUUM ANALYZE changesets_changeset")
    return time.perf_counter() - started


def main() -> None:
    parser = part_parser(__doc__)
    # The skewed log holds about 1.27 revisions per changeset: 790,000 ≈ 1M revisions.
    parser.add_argument("--changesets", type=int, default=790_000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--runs", type=int, default=30)
    args = parse_part_args(parser)
    changesets = 20_000 if args.smoke else args.changesets
    runs = 3 if args.smoke else args.runs
    bench_env()
    fresh_database(DB)
    setup(database=DB)
    filled = populate(changesets, args.partitions)
    width = filled["width"]
    through = width * (args.partitions - 1) - 1  # the end of the next-to-last partition
    pages = _pages()
    result: dict[str, Any] = {"changesets": changesets, "partitions": args.partitions, **filled}
    result["reads_partitioned"] = time_reads(pages, runs)
    result["to_plain_seconds"] = _move(partitioned=False, width=width)
    result["reads_plain"] = time_reads(pages, runs)
    _copy_out(through)
    result["removal_delete"] = time_removal(through)
    _copy_back()
    result["to_partitioned_seconds"] = _move(partitioned=True, width=width)
    result["removal_drop"] = time_removal(through)
    result["through"] = through
    write_json(args.json, result)
    report = _report(result, args)
    write_section(TITLE, report)
    print(report)


def _mb(value: float) -> str:
    return f"{value / 1e6:,.0f} MB"


def _report(result: dict[str, Any], args: argparse.Namespace) -> str:
    reads = [
        [label, f"{result['reads_plain'][label]:.1f}", f"{ms:.1f}"]
        for label, ms in result["reads_partitioned"].items()
    ]
    removal = [
        [
            name,
            f"{r['revisions']:,}",
            f"{r['seconds']:.1f} s",
            _mb(r["bytes_before"]),
            _mb(r["bytes_after"]),
        ]
        for name, r in (
            ("batched DELETE (plain tables)", result["removal_delete"]),
            (f"partition drop ({args.partitions - 1} of each table's)", result["removal_drop"]),
        )
    ]
    return "\n".join(
        [
            header("bench/partitions.py" + (" --smoke" if args.smoke else "")),
            f"{result['changesets']:,} changesets, {result['revisions']:,} revisions"
            f" (`bench/scale_populate.py`'s skewed log, inserted in"
            f" {result['seconds']:.0f} s) on {args.partitions} partitions of"
            f" {result['width']:,} seqs. Reads through the API in-process, warm, median"
            " of repeated runs (ms). Moving the rows of both log tables onto plain tables"
            f" took {result['to_plain_seconds']:.0f} s and back onto partitions"
            f" {result['to_partitioned_seconds']:.0f} s (migrations 0025's and 0038's work,"
            " both ways).",
            "",
            table(["read", "plain tables (ms)", f"{args.partitions} partitions (ms)"], reads),
            "",
            f"The archive cut's removal through seq {result['through']:,} (90% of the"
            " log): changesets, revisions and journal entries. The hot tables' bytes on"
            " disk (heap, indexes, TOAST, summed over partitions) before and after; DELETE"
            " leaves its space to autovacuum for reuse, a dropped partition returns it.",
            "",
            table(["removal", "revisions", "time", "hot bytes before", "after"], removal),
            "",
            "At ten million revisions (about 45 minutes here, mostly the populate and the moves):",
            "",
            "```sh",
            ".venv/bin/python bench/partitions.py --changesets 7900000 --partitions 10",
            "```",
        ]
    )


if __name__ == "__main__":
    main()
