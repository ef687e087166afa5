"""``as_of_time`` resolution and as-of paging by time, at a million and ten million changesets.

    .venv/bin/python bench/asof_time.py [--sizes 1000000,10000000] [--repeat 25]

Each size has a database of its own (``<ATLAS_BENCH_DB or atlas_bench>_asoftime_1m``,
``…_10m``), measured in a child process (Django binds one database per process) and
populated once (a populated database is reused, never populated again), with set-based
SQL through Atlas's own schema:
10,000 entities in ``bench.asof`` (bench/asof.py's shape, ten revisions each),
then the size's changesets on top, one a minute apart, skewed over
namespaces (``bench.t.busy`` most, ``bench.t.rare`` one in 2,000, 2% on a
branch). Before they land, the old descending indexes are added beside the new
ascending ones, so both take the same inserts and ``pgstattuple`` can compare
them. Then times:

1. the ``as_of_time`` resolution at several depths, for a superuser and for
   callers who read only a busy or only a rare namespace, beside the old query
   (a backward walk of the seq index with the time and visibility as filters);
2. paging all 10,000 entities of ``bench.asof`` through the API, 500 a page,
   with ``as_of_time`` and with ``as_of=<id>`` (the page token pins the point);

and records EXPLAIN (ANALYZE, BUFFERS) of the resolutions in docs/benchmarks.md.
The machine may be shared: the plans (rows, buffers) are the evidence, the
milliseconds are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asof as asof_bench
from _common import header, interleaved_ms, summary
from _setup import setup, write_section
from _sqltime import explain as explain_statement
from _sqltime import sql_timer

BUSY, RARE, OTHER = "bench.t.busy", "bench.t.rare", "bench.t.other"
START = datetime(2024, 1, 1, tzinfo=UTC)
NOTE = (
    "Reading it: the plans are the evidence (EXPLAIN (ANALYZE, BUFFERS), warm: the last of "
    "three runs). For a superuser the resolution is a bisection of seq (`atlas_seq_bound`, "
    "migration 0032: a probe of the seq index and its row per step, about 20 steps at a "
    "million; before 0032 one seek on `changeset_at_seq`), then a step back on the seq "
    "index; the function's probes count in the plan's buffers. "
    "For a scoped reader, each of her namespaces is one backward seek below the boundary "
    "on the namespaces' position indexes (`changeset_ns1_seq`, `changeset_ns2_seq`, "
    "migration 0037), and the answer the highest of them: the rare-only reader "
    "(`bench.t.rare` is one changeset in 2,000) costs what a busy one does. (Before 0037 "
    "a window of the 200 changesets nearest the time, then a GIN bitmap of every "
    "changeset of her namespaces below it, which grew with what they hold.) The old query "
    "walked the seq index back from "
    "the newest row, in proportion to the depth. Index sizes: `(branch, seq)` ascending is "
    "32 B/row against 56 descending; `(author_name, seq)` stays at 71 B/row either way, "
    "because with 30 interleaved authors each insert lands at the end of its author's run, "
    "not on the rightmost page, and such splits are 50/50 whatever the direction."
)

OLD_INDEXES = {
    "bench_old_branch_seq_desc": "(branch, seq DESC)",
    "bench_old_author_seq_desc": "(author_name, seq DESC)",
}


def populate(cursor, changesets: int) -> None:
    cursor.execute("SELECT seq FROM changesets_loghead WHERE id = 1 FOR UPDATE")
    base = cursor.fetchone()[0]
    for name, columns in OLD_INDEXES.items():
        cursor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON changesets_changeset {columns}")
    print(f"populating {changesets:,} changesets ...")
    started = time.perf_counter()
    cursor.execute(
        """
        INSERT INTO changesets_changeset
            (id, seq, author_id, author_name, at, message, comment, branch, rpc, op_count,
             namespaces, prev_hash, hash)
        SELECT gen_random_uuid(), %(base)s + g, NULL, 'author-' || (g %% 30),
               %(start)s + g * interval '1 minute', 'bench', '',
               CASE WHEN g %% 50 = 0 THEN 'feature-' || (g %% 20) ELSE '' END, 'PutEntity', 1,
               ARRAY[CASE WHEN g %% 2000 = 7 THEN %(rare)s
                          WHEN g %% 10 = 3 THEN %(other)s ELSE %(busy)s END]::varchar[], NULL, NULL
        FROM generate_series(1, %(n)s) AS g
        """,
        {"base": base, "n": changesets, "start": START, "rare": RARE, "other": OTHER, "busy": BUSY},
    )
    cursor.execute(
        "UPDATE changesets_loghead SET seq = %s, at = %s WHERE id = 1",
        [base + changesets, START + changesets * timedelta(minutes=1)],
    )
    cursor.execute("ANALYZE changesets_changeset")
    print(f"populated in {time.perf_counter() - started:.0f} s")


def index_sizes(cursor) -> list[str]:
    cursor.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    names = [
        "changeset_branch_seq",
        "changeset_author_seq",
        "changeset_at_seq",
        "changesets_changeset_seq_key",
        *OLD_INDEXES,
    ]
    cursor.execute("SELECT count(*) FROM changesets_changeset")
    rows = cursor.fetchone()[0]
    out = ["| index | columns | MB | bytes/row | leaf density % |", "|---|---|---|---|---|"]
    for name in names:
        cursor.execute("SELECT to_regclass(%s)", [name])
        if cursor.fetchone()[0] is None:  # a later layout may have dropped it
            out.append(f"| {name} | (not in this schema) | – | – | – |")
            continue
        cursor.execute(
            "SELECT pg_relation_size(%s::regclass), avg_leaf_density, pg_get_indexdef(%s::regclass)"
            " FROM pgstatindex(%s)",
            [name, name, name],
        )
        size, density, definition = cursor.fetchone()
        columns = definition[definition.index("USING btree") + 12 :]
        out.append(
            f"| {name} | {columns} | {size / 2**20:.1f} | {size / rows:.1f} | {density:.0f} |"
        )
    return out


def old_resolution(at, namespaces):
    """The query before 0014: newest visible baseline changeset by seq, time as a filter."""
    from changesets.models import Changeset
    from changesets.selectors.bounds import end_of_millisecond

    qs = Changeset.objects.filter(branch="", at__lte=end_of_millisecond(at))
    if namespaces is not None:
        qs = qs.filter(namespaces__overlap=namespaces)
    return qs.order_by("-seq").first()


def explain(call) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of ``call``'s last statement with its parameters, the
    last of three runs (warm, like the timed ones)."""
    for _ in range(3):
        with sql_timer() as timer:
            call()
        plan = explain_statement(timer.statements[-1])
    return plan


def resolutions(args, total: int) -> tuple[list[str], dict[str, str]]:
    from changesets.selectors.asof import as_of_time

    readers = {"superuser": None, "reads busy": [BUSY], "reads rare only": [RARE]}
    lines = [
        "| depth (share of the log back) | reader | new median ms | new p95 ms | old median ms |",
        "|---|---|---|---|---|",
    ]
    plans = {}
    for depth in (0.0, 0.01, 0.5, 0.99):
        at = START + timedelta(minutes=int(total * (1 - depth)), seconds=20)
        for label, namespaces in readers.items():
            calls = {
                "new": lambda ns=namespaces, at=at: as_of_time(at=at, namespaces=ns),
                "old": lambda ns=namespaces, at=at: old_resolution(at, ns),
            }
            assert calls["new"]().seq == calls["old"]().seq
            new = summary(interleaved_ms({"new": calls["new"]}, args.repeat)["new"])
            old = summary(interleaved_ms({"old": calls["old"]}, 3)["old"])
            lines.append(
                f"| {depth} | {label} | {new['p50']:.2f} | {new['p95']:.2f} | {old['p50']:.1f} |"
            )
            print(lines[-1])
            if depth == 0.5:
                plans[label] = explain(calls["new"])
    return lines, plans


# The seek the bisection replaced (migration 0032 dropped the index it ran on).
OLD_BOUND = "SELECT seq FROM changesets_changeset WHERE at <= %s ORDER BY at DESC, seq DESC LIMIT 1"
NEW_BOUND = "SELECT atlas_seq_bound(%s::timestamptz, true)"


def boundary_cost(args, total: int) -> list[str]:
    """The time boundary alone: the bisection against one seek on an ``(at, seq)`` index
    built for the comparison and dropped after it, at 200 times spread over the log,
    interleaved; both must name the same seq at every time."""
    import random

    from django.db import connection

    rng = random.Random(18)
    times = [START + timedelta(minutes=rng.randrange(total), seconds=20) for _ in range(200)]
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE INDEX IF NOT EXISTS bench_old_at_seq ON changesets_changeset (at, seq)"
        )
        cursor.execute("ANALYZE changesets_changeset")

        def run(sql: str) -> list[int]:
            found = []
            for at in times:
                cursor.execute(sql, [at])
                found.append(cursor.fetchone()[0])
            return found

        try:
            assert run(OLD_BOUND) == run(NEW_BOUND)
            samples = interleaved_ms(
                {"seek": lambda: run(OLD_BOUND), "bisect": lambda: run(NEW_BOUND)}, args.repeat
            )
        finally:
            cursor.execute("DROP INDEX IF EXISTS bench_old_at_seq")
    seek, bisect = (summary(samples[k])["p50"] / len(times) for k in ("seek", "bisect"))
    return [
        "| time → seq boundary, per call, at the client | median ms |",
        "|---|---|",
        f"| one seek on an `(at, seq)` index (before migration 0032) | {seek:.3f} |",
        f"| bisection of seq, `atlas_seq_bound` (no index on `at`) | {bisect:.3f} |",
    ]


def paging(args) -> list[str]:
    from django.conf import settings
    from rest_framework.test import APIClient

    from changesets.models import Changeset
    from tests.entities.factories import SuperuserFactory

    settings.ALLOWED_HOSTS = ["testserver"]
    client = APIClient()
    client.force_authenticate(SuperuserFactory(username=f"bench-time-{time.time_ns()}"))
    point = Changeset.objects.filter(namespaces__contains=[asof_bench.NS]).order_by("-seq").first()
    stamp = point.at.isoformat(timespec="milliseconds")

    def walk(param: dict) -> int:
        params, seen = {"namespace": asof_bench.NS, "page_size": 500, **param}, 0
        while True:
            body = client.get("/api/v1/entities", params).json()
            seen += len(body["results"])
            if not body["next_page_token"]:
                return seen
            params["page_token"] = body["next_page_token"]

    reads = {
        "as_of=<id>": lambda: walk({"as_of": str(point.id)}),
        "as_of_time": lambda: walk({"as_of_time": stamp}),
    }
    assert reads["as_of=<id>"]() == reads["as_of_time"]() == 10_000
    timed = interleaved_ms(reads, args.pages_repeat, rotate=True)
    by_id = summary(timed["as_of=<id>"])["p50"]
    lines = ["| traversal | median ms | p95 ms | × as_of=<id> |", "|---|---|---|---|"]
    for name in reads:
        s = summary(timed[name])
        lines.append(f"| {name} | {s['p50']:.0f} | {s['p95']:.0f} | {s['p50'] / by_id:.2f} |")
    print("\n".join(lines))
    return lines, summary(timed["as_of_time"])["p50"] / by_id


def stage(args: argparse.Namespace) -> dict[str, Any]:
    """In a child process bound to this size's database: populate once, then measure."""
    setup(database=args.database)
    from django.db import connection, transaction

    from changesets.selectors.log import changeset_list, log_head
    from entities.models import Namespace

    if not Namespace.objects.filter(name=asof_bench.NS).exists():
        with transaction.atomic(), connection.cursor() as cursor:
            asof_bench.populate(cursor, 10_000, 9)
    if not changeset_list(namespaces=None, namespace=RARE, limit=1):
        with transaction.atomic(), connection.cursor() as cursor:
            populate(cursor, args.changesets)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE changesets_changeset")
    head = log_head()
    assert head is not None
    asof_top = changeset_list(namespaces=None, namespace=asof_bench.NS, limit=1)[0].seq
    total = head.seq - asof_top  # the time-spread changesets on top of bench.asof's
    with connection.cursor() as cursor:
        sizes = index_sizes(cursor)
    print("\n".join(sizes))
    timing, plans = resolutions(args, total)
    bound = boundary_cost(args, total)
    print("\n".join(bound))
    pages, ratio = paging(args)
    return {
        "count": head.seq,
        "total": total,
        "timing": timing,
        "plans": plans,
        "pages": pages,
        "ratio": ratio,
        "sizes": sizes,
        "bound": bound,
    }


def section(args: argparse.Namespace, stages: list[dict[str, Any]]) -> str:
    lines = [
        header(f".venv/bin/python bench/asof_time.py --sizes {args.sizes}"),
        "",
        f"Median and p95 of {args.repeat} interleaved rounds in-process; the old query 3"
        " rounds. Shared, noisy machine: read the plans.",
        "",
        NOTE,
    ]
    for st in stages:
        verdict = "met" if st["ratio"] <= 1.2 else f"**missed** ({st['ratio']:.2f}×)"
        lines += [
            "",
            f"### {st['count']:,} changesets",
            "",
            f"{st['total']:,} of them time-spread over ~{st['total'] // 525_600 + 1} years,"
            " one a minute, on top of bench/asof.py's 10,000 entities.",
            "",
            *st["timing"],
            "",
            f"The boundary alone, {args.repeat} interleaved rounds of 200 times each:",
            "",
            *st["bound"],
            "",
            f"Paging all 10,000 entities of `{asof_bench.NS}` through `GET /api/v1/entities`,"
            f" 500 a page (20 pages), superuser, in-process client, {args.pages_repeat} rounds"
            f" (target: `as_of_time` within 1.2× of `as_of=<id>`: {verdict}):",
            "",
            *st["pages"],
            "",
            "Index sizes (pgstattuple) after the populate's inserts; the `bench_old_*` indexes"
            " are the pre-0014 descending definitions, built beside the new ones from the same"
            " inserts:",
            "",
            *st["sizes"],
        ]
        for label, plan in st["plans"].items():
            lines += [
                "",
                f"EXPLAIN (ANALYZE, BUFFERS) of the resolution half-way back, {label},"
                f" {st['count']:,} changesets:",
                "",
                "```",
                plan,
                "```",
            ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000,10000000", help="time-spread changesets")
    parser.add_argument("--repeat", type=int, default=25)
    parser.add_argument("--pages-repeat", type=int, default=10)
    parser.add_argument("--changesets", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--database", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.changesets is not None:
        Path(args.out).write_text(json.dumps(stage(args)))
        return
    base = os.environ.get("ATLAS_BENCH_DB") or "atlas_bench"
    stages = []
    for n in [int(s) for s in args.sizes.split(",")]:
        name = f"{base}_asoftime_{n // 1_000_000}m" if n >= 1_000_000 else f"{base}_asoftime_{n}"
        out = Path(f"/tmp/atlas-bench-asoftime-{n}-{time.time_ns()}.json")
        print(f"as_of_time: {n:,} changesets in {name} ...", flush=True)
        cmd = [sys.executable, __file__, "--changesets", str(n), "--database", name]
        cmd += ["--out", str(out), "--repeat", str(args.repeat)]
        cmd += ["--pages-repeat", str(args.pages_repeat)]
        subprocess.run(cmd, check=True)
        stages.append(json.loads(out.read_text()))
        out.unlink()
    setup(database=name)  # for the header's server version
    text = section(args, stages)
    print(text)
    write_section("as_of_time resolution and paging by time", text)


if __name__ == "__main__":
    main()
