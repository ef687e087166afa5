"""Entity history pages (newest 50 of one entity) as the log grows: 10k, 1M, 10M revisions.

    .venv/bin/python bench/history_pages.py [--sizes 10000,1000000,10000000] [--smoke]

Each size gets a database of its own (``atlas_bench_hist_<size>``, kept and reused
by later runs), populated with set-based SQL through Atlas's own schema: E = N/100
entities, each with 100 revisions (create, then updates; both images and both
versions on every row, like the write service makes them), ten revisions per
changeset, the live entity rows and the log head to match. Then the newest 50
revisions of one entity — a different entity each call, so the page is not the
same cached one — through the selector (``entity_history``) and through
``GET /api/v1/entities/…/history`` (in-process client), median and p95.
Target: flat (the largest size within 1.3× of 10k).

Each size runs in a child process (Django is bound to one database per process).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from _common import bench_env, database, header, image, plot, summary, table, write_json
from _setup import setup, write_section

NS = "bench.hist"
PER_ENTITY = 100
PER_CHANGESET = 10
PAYLOAD = "h" * 40
UUID_OF_G = (
    "(lpad(to_hex((1700000000000 + {g})::bigint), 12, '0') || '7000' || '8'"
    " || lpad(to_hex(%(base)s + {g}), 15, '0'))::uuid"
)


BULK_TABLES = ("changesets_revision", "changesets_changeset")


def drop_secondary(cursor, table: str) -> list[str]:
    """Drop ``table``'s unique/foreign-key constraints and secondary indexes (not the
    primary key); return the statements that recreate them exactly as they were.

    Loading an empty table and then building each index once (a sort) is several
    times faster than maintaining six indexes row by row over 10M rows.
    """
    cursor.execute(
        "SELECT conname, pg_get_constraintdef(oid), contype FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype IN ('u', 'f')",
        [table],
    )
    constraints = cursor.fetchall()
    cursor.execute(
        "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x"
        " JOIN pg_class i ON i.oid = x.indexrelid"
        " WHERE x.indrelid = %s::regclass AND NOT x.indisprimary"
        " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)",
        [table],
    )
    indexes = cursor.fetchall()
    for name, _definition, _kind in constraints:
        cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    for name, _definition in indexes:
        cursor.execute(f'DROP INDEX "{name}"')
    # Unique constraints first (their indexes), foreign keys last (they validate).
    recreate = [definition for _name, definition in indexes]
    recreate += [
        f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}'
        for name, definition, kind in sorted(constraints, key=lambda c: c[2] == "f")
    ]
    return recreate


def populate(cursor, total: int) -> float:
    """Write ``total`` revisions (and their changesets, entities, log head); seconds taken."""
    entities = max(total // PER_ENTITY, PER_CHANGESET)
    changesets = -(-total // PER_CHANGESET)
    started = time.perf_counter()
    cursor.execute("SET LOCAL maintenance_work_mem = '512MB'")
    cursor.execute("SET LOCAL work_mem = '64MB'")
    recreate: list[str] = []
    cursor.execute("SELECT count(*) FROM changesets_revision")
    if cursor.fetchone()[0] == 0:  # a fresh database: bulk-load, then index
        for table in BULK_TABLES:
            recreate += drop_secondary(cursor, table)
    cursor.execute("SELECT seq FROM changesets_loghead WHERE id = 1 FOR UPDATE")
    base = cursor.fetchone()[0]
    cursor.execute(
        "INSERT INTO entities_namespace (name, protected, created_at) VALUES (%s, false, now())",
        [NS],
    )
    cursor.execute(
        f"""
        INSERT INTO changesets_changeset
            (id, seq, author_id, author_name, at, message, comment, branch, rpc, op_count,
             namespaces, prev_hash, hash)
        SELECT {UUID_OF_G.format(g="g")},
               %(base)s + g, NULL, 'bench', to_timestamp((1700000000000 + g) / 1000.0),
               'BatchMutate: ' || n || ' change(s)', '', '', 'BatchMutate', n,
               ARRAY[%(ns)s], '', ''
        FROM generate_series(1, %(c)s) AS g,
             LATERAL (SELECT LEAST(%(k)s, %(total)s - (g - 1) * %(k)s) AS n) AS cnt
        """,
        {"base": base, "c": changesets, "ns": NS, "k": PER_CHANGESET, "total": total},
    )
    cursor.execute(
        f"""
        INSERT INTO changesets_revision
            (changeset_id, seq, branch, at, namespace, kind, slug, op, before, after,
             before_version, after_version)
        SELECT {UUID_OF_G.format(g="g")},
               %(base)s + g, '', to_timestamp((1700000000000 + g) / 1000.0),
               %(ns)s, 'item', 'e' || lpad((r %% %(e)s)::text, 7, '0'),
               CASE WHEN step = 0 THEN 'create' ELSE 'update' END,
               CASE WHEN step = 0 THEN NULL
                    ELSE jsonb_build_object('v', step - 1, 'payload', %(p)s) END,
               jsonb_build_object('v', step, 'payload', %(p)s),
               CASE WHEN step = 0 THEN NULL ELSE step END,
               step + 1
        FROM generate_series(0, %(total)s - 1) AS r,
             LATERAL (SELECT r / %(k)s + 1 AS g, r / %(e)s AS step) AS x
        """,
        {"base": base, "e": entities, "total": total, "ns": NS, "p": PAYLOAD, "k": PER_CHANGESET},
    )
    cursor.execute(
        f"""
        INSERT INTO entities_entity
            (namespace_id, kind, slug, content, version, created_at, updated_at, changeset_id)
        SELECT %(ns)s, 'item', 'e' || lpad(e::text, 7, '0'),
               jsonb_build_object('v', last, 'payload', %(p)s), last + 1, now(), now(),
               {UUID_OF_G.format(g="g")}
        FROM generate_series(0, %(e)s - 1) AS e,
             LATERAL (SELECT (%(total)s - 1 - e) / %(e)s AS last) AS l,
             LATERAL (SELECT (last * %(e)s + e) / %(k)s + 1 AS g) AS cs
        """,
        {"ns": NS, "e": entities, "total": total, "p": PAYLOAD, "base": base, "k": PER_CHANGESET},
    )
    cursor.execute(
        "UPDATE changesets_loghead SET seq = %s, at = GREATEST(at, to_timestamp(%s / 1000.0))"
        " WHERE id = 1",
        [base + changesets, 1700000000000 + changesets],
    )
    loaded = time.perf_counter() - started
    for statement in recreate:
        cursor.execute(statement)
    print(
        f"  loaded in {loaded:.0f} s, indexes and constraints rebuilt in"
        f" {time.perf_counter() - started - loaded:.0f} s",
        flush=True,
    )
    return time.perf_counter() - started


def stage(total: int, repeat: int, database: str) -> dict:
    """In a child process: populate (unless already there), then time the pages."""
    bench_env()
    setup(database=database)
    from django.db import connection, transaction
    from rest_framework.test import APIClient

    from changesets.models import Revision
    from changesets.selectors import entity_history
    from entities.models import Namespace
    from entities.store import EntityKey
    from tests.entities.factories import StaffFactory

    populated = 0.0
    if not Namespace.objects.filter(name=NS).exists():
        with transaction.atomic(), connection.cursor() as cursor:
            populated = populate(cursor, total)
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE changesets_revision")
            cursor.execute("VACUUM ANALYZE changesets_changeset")
            cursor.execute("VACUUM ANALYZE entities_entity")
        populated += time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM changesets_revision")
        revisions = cursor.fetchone()[0]
        cursor.execute("SELECT pg_total_relation_size('changesets_revision')")
        table_bytes = cursor.fetchone()[0]
    entities = max(total // PER_ENTITY, PER_CHANGESET)
    rng = random.Random(total)
    targets = [EntityKey(NS, "item", f"e{rng.randrange(entities):07d}") for _ in range(repeat + 3)]

    def selector(key: EntityKey) -> None:
        rows = entity_history(key=key, limit=51)
        assert len(rows) == min(51, PER_ENTITY), len(rows)

    client = APIClient()
    client.force_authenticate(StaffFactory(username="bench-reader"))

    def http(key: EntityKey) -> None:
        response = client.get(f"/api/v1/entities/{key.namespace}/item/{key.slug}/history")
        assert response.status_code == 200, response.content[:300]
        assert len(response.json()["results"]) == 50

    out = {"total": total, "revisions": revisions, "populate_s": populated, "bytes": table_bytes}
    for name, fn in (("selector", selector), ("http", http)):
        first = time.perf_counter()
        fn(targets[0])
        cold = (time.perf_counter() - first) * 1000
        for key in targets[1:3]:
            fn(key)
        samples = []
        deadline = time.monotonic() + 60
        for key in targets[3:]:
            start = time.perf_counter()
            fn(key)
            samples.append((time.perf_counter() - start) * 1000)
            if time.monotonic() > deadline:
                break
        out[name] = {**summary(samples), "first": cold}
    key = targets[0]
    with connection.cursor() as cursor:
        qs = Revision.objects.filter(
            branch="", namespace=key.namespace, kind=key.kind, slug=key.slug
        ).select_related("changeset")
        sql, params = qs.order_by("-seq")[:51].query.sql_with_params()
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
        out["plan"] = "\n".join(r[0] for r in cursor.fetchall())
    return out


def already_populated(name: str) -> bool:
    """Whether database ``name`` exists and holds a finished population (its namespace row)."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg
    from _setup import server_url

    parts = urlsplit(server_url())
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
    try:
        with psycopg.connect(urlunsplit(parts._replace(path="/" + name))) as conn:
            row = conn.execute("SELECT 1 FROM entities_namespace WHERE name = %s", [NS]).fetchone()
            return row is not None
    except psycopg.Error:
        return False


def label(total: int) -> str:
    return f"{total // 1_000_000}m" if total >= 1_000_000 else f"{total // 1000}k"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,1000000,10000000")
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--stage", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--database", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--budget",
        type=float,
        default=1500,
        help="seconds for all sizes; a size whose population would not fit is skipped",
    )
    args = parser.parse_args()
    if args.stage is not None:
        result = stage(args.stage, args.repeat, args.database)
        Path(args.out).write_text(json.dumps(result))
        return

    sizes = [1000, 5000] if args.smoke else [int(s) for s in args.sizes.split(",")]
    repeat = 5 if args.smoke else args.repeat
    started = time.monotonic()
    results = []
    skipped = []
    rate = None  # seconds per revision of the last stage that populated
    for total in sizes:
        elapsed = time.monotonic() - started
        left = args.budget - elapsed
        database_name = f"{database(args.smoke)}_hist_{label(total)}"
        ready = already_populated(database_name)
        # Population grows about linearly (bulk load, then one sort per index); the
        # reads take under a minute. Skip a size that would not finish in the budget.
        estimate = (0.0 if ready or rate is None else rate * total * 1.2) + 60
        if results and estimate > left:
            skipped.append(
                (
                    total,
                    f"would not fit the time budget: populating it was estimated at"
                    f" {estimate:.0f} s from the previous size, {max(left, 0):.0f} s were left",
                )
            )
            continue
        out = Path(f"/tmp/atlas-bench-hist-{os.getpid()}-{total}.json")
        print(
            f"history: {total:,} revisions in {database_name}"
            f" ({'reused' if ready else 'populating'}) ...",
            flush=True,
        )
        cmd = [sys.executable, __file__, "--stage", str(total), "--repeat", str(repeat)]
        cmd += ["--database", database_name, "--out", str(out)]
        subprocess.run(cmd, check=True, timeout=max(120.0, left + 120))
        results.append(json.loads(out.read_text()))
        out.unlink()
        r = results[-1]
        if r["populate_s"]:
            rate = r["populate_s"] / total
        print(
            f"  populate {r['populate_s']:.0f} s, selector p50 {r['selector']['p50']:.2f} ms,"
            f" http p50 {r['http']['p50']:.2f} ms",
            flush=True,
        )

    bench_env()
    setup(database=database(args.smoke))  # the main benchmark database, for the header
    base = results[0]
    rows = []
    for r in results:
        rows.append(
            [
                f"{r['revisions']:,}",
                f"{r['bytes'] / 2**30:.2f} GiB"
                if r["bytes"] > 2**30
                else f"{r['bytes'] / 2**20:.0f} MiB",
                r["selector"]["p50"],
                r["selector"]["p95"],
                f"{r['selector']['p50'] / base['selector']['p50']:.2f}×",
                r["http"]["p50"],
                r["http"]["p95"],
                f"{r['http']['p50'] / base['http']['p50']:.2f}×",
                r["selector"]["first"],
                f"{r['populate_s']:.0f} s" if r["populate_s"] else "reused",
            ]
        )
    plot(
        "history_page_vs_revisions.png",
        {
            "Atlas entity_history (selector)": (
                [r["revisions"] for r in results],
                [r["selector"]["p50"] for r in results],
            ),
            "Atlas GET …/history (in-process HTTP)": (
                [r["revisions"] for r in results],
                [r["http"]["p50"] for r in results],
            ),
        },
        title="Entity history page (newest 50) vs total revisions",
        xlabel="revisions in the log",
        ylabel="ms (median)",
        logx=True,
        ymin0=True,
    )
    cmd = ".venv/bin/python bench/history_pages.py" + (" --smoke" if args.smoke else "")
    lines = [
        header(cmd),
        "",
        f"Newest 50 revisions of one entity (a different, random entity each call;"
        f" {repeat} calls after 3 warm-ups), each size in a database of its own populated"
        f" with set-based SQL through Atlas's schema ({PER_ENTITY} revisions per entity,"
        f" {PER_CHANGESET} per changeset). `first` = the first call after connecting.",
        "",
        table(
            [
                "revisions",
                "revision table",
                "selector p50 ms",
                "p95",
                "× smallest",
                "HTTP p50 ms",
                "p95",
                "× smallest",
                "first ms",
                "populated in",
            ],
            rows,
        ),
    ]
    for total, why in skipped:
        lines += ["", f"**{total:,} revisions: not measured** — {why}."]
    lines += [
        "",
        image("history_page_vs_revisions.png", "history page time vs total revisions"),
        "",
        f"EXPLAIN ANALYZE at {results[-1]['revisions']:,} revisions:",
        "",
        "```",
        results[-1]["plan"],
        "```",
    ]
    write_section("Against the peers 3. Entity history page vs total revisions", "\n".join(lines))
    write_json(args.json, {"sizes": results, "skipped": skipped})


if __name__ == "__main__":
    main()
