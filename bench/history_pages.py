"""Entity history pages (newest 50 of one entity) as the log grows: 10k, 1M, 10M revisions,
Atlas and the peers.

    .venv/bin/python bench/history_pages.py [--sizes 10000,1000000,10000000] [--smoke]

Each size gets a database of its own (``atlas_bench_hist_<size>``, kept and reused
by later runs; migrated with bench.settings), populated with set-based SQL through
Atlas's own schema: E = N/100 entities, each with 100 revisions (create, then
updates; both images and both versions on every row, like the write service makes
them), ten revisions per changeset, the live entity rows and the log head to match.
With the peers installed, the same database gets the same history in each peer's
own tables (bench/history_vs_peers.py); the loads run two at a time. Then the
newest 50 revisions of one entity — a different entity each call, so the page is
not the same cached one — through the selector (``entity_history``) and each peer's
idiomatic read, interleaved, then through ``GET /api/v1/entities/…/history``
(in-process client), median and p95.
Target: flat (the largest size within 1.3× of 10k).

Each size runs in a child process (Django is bound to one database per process).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import history_vs_peers as hvp
from _common import (
    bench_env,
    database,
    drop_for_load,
    header,
    image,
    parse_part_args,
    part_parser,
    peers_available,
    plot,
    summary,
    table,
    write_json,
)
from _setup import setup, write_section

NS = "bench.hist"
PER_ENTITY = 100
PER_CHANGESET = 10
PAYLOAD = "h" * 40
UUID_OF_G = (
    "(lpad(to_hex((1700000000000 + {g})::bigint), 12, '0') || '7000' || '8'"
    " || lpad(to_hex(%(base)s + {g}), 15, '0'))::uuid"
)


POPULATE_ORDER = ["Atlas", "django-reversion", "django-pghistory", "django-simple-history"]
BULK_TABLES = ("changesets_revision", "changesets_changeset")


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
        recreate = drop_for_load(cursor, BULK_TABLES)
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
               ARRAY[%(ns)s], NULL, NULL
        FROM generate_series(1, %(c)s) AS g,
             LATERAL (SELECT LEAST(%(k)s, %(total)s - (g - 1) * %(k)s) AS n) AS cnt
        """,
        {"base": base, "c": changesets, "ns": NS, "k": PER_CHANGESET, "total": total},
    )
    cursor.execute(
        f"""
        INSERT INTO changesets_revision
            (changeset_id, seq, branch, at, namespace, kind, slug, op, undo, after,
             before_version, after_version, changed)
        SELECT {UUID_OF_G.format(g="g")},
               %(base)s + g, '', to_timestamp((1700000000000 + g) / 1000.0),
               %(ns)s, 'item', 'e' || lpad((r %% %(e)s)::text, 7, '0'),
               CASE WHEN step = 0 THEN 'create' ELSE 'update' END,
               -- the before image as stored (atlas_undo of these images, spelled out)
               CASE WHEN step = 0 THEN NULL ELSE jsonb_build_object('v', step - 1) END,
               jsonb_build_object('v', step, 'payload', %(p)s),
               CASE WHEN step = 0 THEN NULL ELSE step END,
               step + 1,
               -- atlas_changed_keys of these images, spelled out (cheaper at 10M rows),
               -- stored joined by '~2' (migration 0035)
               CASE WHEN step = 0 THEN '/payload~2/v' ELSE '/v' END
        FROM generate_series(0, %(total)s - 1) AS r,
             LATERAL (SELECT r / %(k)s + 1 AS g, r / %(e)s AS step) AS x
        """,
        {"base": base, "e": entities, "total": total, "ns": NS, "p": PAYLOAD, "k": PER_CHANGESET},
    )
    # Bulk-loaded history the write service would take hours to write: as the table's
    # owner, turn the entity write guard off for this one insert (entities/writer.py).
    cursor.execute("ALTER TABLE entities_entity DISABLE TRIGGER entity_write_guard")
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
    # ALTER TABLE refuses while the insert's deferred foreign-key checks are queued.
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    cursor.execute("ALTER TABLE entities_entity ENABLE TRIGGER entity_write_guard")
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


def populate_atlas(total: int) -> dict:
    """Atlas's population in one transaction, then VACUUM ANALYZE; the seconds it took."""
    from django.db import connection, transaction

    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        populate(cursor, total)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE changesets_revision")
        cursor.execute("VACUUM ANALYZE changesets_changeset")
        cursor.execute("VACUUM ANALYZE entities_entity")
    return {"total_s": time.perf_counter() - started}


def run_in_pairs(jobs: dict[str, Callable[[], dict]]) -> dict[str, dict]:
    """Run the population ``jobs`` two at a time (each in a thread of its own, so on a
    connection of its own; they write different tables); their results by name.

    Two at a time: the suite's machine has two cores, and each load is one backend.
    django-reversion's and django-simple-history's loads both drop (and re-add) a
    foreign key to auth_user, which locks auth_user exclusively until commit; the
    order below mostly keeps them apart, and when they meet, one waits for the other
    (no deadlock: neither needs the other's tables)."""
    from django.db import connection

    def run(name: str) -> dict:
        try:
            result = jobs[name]()
            split = (
                f" (load {result['load_s']:.0f} s, indexes {result['index_s']:.0f} s,"
                f" VACUUM ANALYZE {result['vacuum_s']:.0f} s)"
                if "load_s" in result
                else ""
            )
            print(f"  {name}: populated in {result['total_s']:.0f} s{split}", flush=True)
            return result
        finally:
            connection.close()

    if not jobs:
        return {}
    started = time.perf_counter()
    # The longest first (Atlas's and reversion's have the most indexes to build).
    order = sorted(jobs, key=lambda name: POPULATE_ORDER.index(name))
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, name) for name in order}
        results = {name: future.result() for name, future in futures.items()}
    results["wall_s"] = time.perf_counter() - started
    return results


def stage(total: int, repeat: int, database: str) -> dict:
    """In a child process: populate (unless already there), then time the pages.

    Atlas's selector and each peer's page are timed interleaved (the same target
    entity, in a rotating order), then Atlas's HTTP endpoint on its own."""
    bench_env()
    setup(settings="bench.settings", database=database)
    from django.db import connection
    from rest_framework.test import APIClient

    from changesets.models import Revision
    from changesets.selectors.log import entity_history
    from entities.models import Namespace
    from entities.store import EntityKey
    from tests.entities.factories import SuperuserFactory

    peers = hvp.PEERS if peers_available() else ()
    entities = max(total // PER_ENTITY, PER_CHANGESET)
    jobs = {}
    if not Namespace.objects.filter(name=NS).exists():
        jobs["Atlas"] = lambda: populate_atlas(total)
    for peer in peers:
        with connection.cursor() as cursor:
            done = hvp.populated(cursor, peer, NS)
        if not done:
            jobs[peer] = functools.partial(
                hvp.populate, peer, NS, entities, total, PER_CHANGESET, PAYLOAD
            )
    populated = run_in_pairs(jobs)
    if "django-reversion" in peers:
        hvp.check_rv_serialization(f"e{entities - 1:07d}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM changesets_revision")
        revisions = cursor.fetchone()[0]
        cursor.execute(  # over its partitions: a partitioned table has no storage of its own
            "SELECT sum(pg_total_relation_size(r))::bigint"
            " FROM (SELECT 'changesets_revision'::regclass"
            " AS r UNION ALL SELECT inhrelid::regclass FROM pg_inherits"
            " WHERE inhparent = 'changesets_revision'::regclass) p"
        )
        table_bytes = cursor.fetchone()[0]
    rng = random.Random(total)
    slugs = [f"e{rng.randrange(entities):07d}" for _ in range(repeat + 3)]
    targets = [EntityKey(NS, "item", slug) for slug in slugs]

    def selector(i: int) -> None:
        rows = entity_history(key=targets[i], limit=51)
        assert len(rows) == min(51, PER_ENTITY), len(rows)

    client = APIClient()
    client.force_authenticate(SuperuserFactory(username="bench-root-reader"))

    def http(i: int) -> None:
        key = targets[i]
        response = client.get(f"/api/v1/entities/{key.namespace}/item/{key.slug}/history")
        assert response.status_code == 200, response.content[:300]
        assert len(response.json()["results"]) == 50

    out: dict = {
        "total": total,
        "revisions": revisions,
        "populate_s": populated.get("wall_s", 0.0),
        "populated": populated,
        "bytes": table_bytes,
        "peers": {},
    }
    # Interleaved: target 0 is each one's first call after connecting, 1-2 warm up,
    # then every target is read by each implementation in turn (rotating who goes first).
    # Two passes over the same targets: the first reads pages the cache may not hold (at
    # 10M rows, four implementations' tables outgrow the page cache, so it mostly times
    # the disk); the second reads them cached and times the work itself, which is what
    # "flat as the log grows" is about. Both are reported; p50 is the second.
    calls = {"selector": selector}
    if peers:
        calls.update(hvp.readers(slugs))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    cold: dict[str, list[float]] = {name: [] for name in calls}
    first: dict[str, float] = {}
    deadline = time.monotonic() + 60 * len(calls)
    names = list(calls)
    for warm in (False, True):
        for i in range(len(targets)):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                start = time.perf_counter()
                calls[name](i)
                took = (time.perf_counter() - start) * 1000
                if i == 0 and not warm:
                    first[name] = took
                elif i >= 3:
                    (samples if warm else cold)[name].append(took)
            if time.monotonic() > deadline:
                break
    out["selector"] = {
        **summary(samples["selector"] or cold["selector"]),
        "first": first["selector"],
        "cold_p50": summary(cold["selector"])["p50"],
    }
    for peer in peers:
        out["peers"][peer] = {
            **summary(samples[peer] or cold[peer]),
            "first": first[peer],
            "cold_p50": summary(cold[peer])["p50"],
        }
    http_samples = []
    deadline = time.monotonic() + 60
    for i in range(len(targets)):
        start = time.perf_counter()
        http(i)
        if i >= 3:
            http_samples.append((time.perf_counter() - start) * 1000)
        if time.monotonic() > deadline:
            break
    out["http"] = summary(http_samples)

    key = targets[0]
    with connection.cursor() as cursor:
        qs = Revision.objects.filter(
            branch="", namespace=key.namespace, kind=key.kind, slug=key.slug
        ).select_related("changeset")
        sql, params = qs.order_by("-seq")[:51].query.sql_with_params()
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
        out["plan"] = "\n".join(r[0] for r in cursor.fetchall())
        for peer in peers:
            sql, params = hvp.page_sql(peer, key.slug)
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
            plan = "\n".join(r[0] for r in cursor.fetchall())
            out["peers"][peer].update(
                plan=plan, indexes=plan_indexes(plan), bytes=hvp.table_bytes(cursor, peer)
            )
    return out


def plan_indexes(plan: str) -> list[str]:
    """The indexes a plan reads, and ``Seq Scan on <table>`` for any sequential scan."""
    found = re.findall(r"Index(?: Only)? Scan(?: Backward)? using (\S+)", plan)
    found += re.findall(r"Bitmap Index Scan on (\S+)", plan)
    found += [f"Seq Scan on {t}" for t in re.findall(r"Seq Scan on (\S+)", plan)]
    return list(dict.fromkeys(found))


def already_populated(name: str, peers: tuple[str, ...]) -> bool:
    """Whether database ``name`` exists and holds a finished population: Atlas's (its
    namespace row) and each of ``peers``' (its live rows)."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg
    from _setup import server_url

    parts = urlsplit(server_url())
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
    try:
        with psycopg.connect(urlunsplit(parts._replace(path="/" + name))) as conn:
            sql = "SELECT 1 FROM entities_namespace WHERE name = %s"
            if not conn.execute(sql, [NS]).fetchone():
                return False
            for peer in peers:
                sql = f"SELECT 1 FROM {hvp.LIVE_TABLE[peer]} WHERE namespace = %s LIMIT 1"
                if not conn.execute(sql, [NS]).fetchone():
                    return False
            return True
    except psycopg.Error:  # not migrated with the peers yet
        return False


def label(total: int) -> str:
    return f"{total // 1_000_000}m" if total >= 1_000_000 else f"{total // 1000}k"


def main() -> None:
    parser = part_parser(__doc__, doc_option=False)
    parser.add_argument("--sizes", default="10000,1000000,10000000")
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--stage", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--database", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--budget",
        type=float,
        default=1500,
        help="seconds for all sizes; a size whose population would not fit is skipped",
    )
    args = parse_part_args(parser)
    if args.stage is not None:
        result = stage(args.stage, args.repeat, args.database)
        Path(args.out).write_text(json.dumps(result))
        return

    bench_env()
    setup(settings="bench.settings", database=database(args.smoke))  # for the header
    peers = hvp.PEERS if peers_available() else ()
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
        ready = already_populated(database_name, peers)
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
            f" http p50 {r['http']['p50']:.2f} ms"
            + "".join(f", {p} p50 {v['p50']:.2f} ms" for p, v in r["peers"].items()),
            flush=True,
        )
    write_section(
        "Against the peers 3. Entity history page vs total revisions",
        report(results, skipped, peers, repeat, args.smoke),
    )
    write_json(args.json, {"sizes": results, "skipped": skipped, "peers": list(peers)})


def size_of(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n > 2**30 else f"{n / 2**20:.0f} MiB"


def report(results: list[dict], skipped: list, peers: tuple[str, ...], repeat: int, smoke: bool):
    """The section's text (and its plot) from the stages' results."""
    base = results[0]
    rows = []
    for r in results:
        atlas_pop = r["populated"].get("Atlas")
        rows.append(
            [
                f"{r['revisions']:,}",
                size_of(r["bytes"]),
                r["selector"]["p50"],
                r["selector"]["p95"],
                f"{r['selector']['p50'] / base['selector']['p50']:.2f}×",
                r["http"]["p50"],
                r["http"]["p95"],
                f"{r['http']['p50'] / base['http']['p50']:.2f}×",
                r["selector"].get("cold_p50", float("nan")),
                r["selector"]["first"],
                f"{atlas_pop['total_s']:.0f} s" if atlas_pop else "reused",
            ]
        )
    xs = [r["revisions"] for r in results]
    series = {
        "Atlas entity_history (selector)": (xs, [r["selector"]["p50"] for r in results]),
        "Atlas GET …/history (in-process HTTP)": (xs, [r["http"]["p50"] for r in results]),
    }
    for peer in peers:
        series[peer] = (xs, [r["peers"][peer]["p50"] for r in results])
    plot(
        "history_page_vs_revisions.png",
        series,
        title="Entity history page (newest 50) vs total revisions",
        xlabel="history rows in the table (log scale)",
        ylabel="ms (median)",
        logx=True,
        ymin0=True,
    )
    cmd = ".venv/bin/python bench/history_pages.py" + (" --smoke" if smoke else "")
    lines = [
        header(cmd),
        "",
        f"Newest 50 revisions of one entity (a different, random entity each call;"
        f" {repeat} calls after 3 warm-ups), each size in a database of its own populated"
        f" with set-based SQL through Atlas's schema ({PER_ENTITY} revisions per entity,"
        f" {PER_CHANGESET} per changeset). Two passes over the same targets: p50/p95 are"
        " the second (pages cached: the cost of the work, which is what must stay flat);"
        " `cold p50` is the first, right after the population or a reconnect, when at 10M"
        " rows the four implementations' tables (about 13 GiB) no longer fit the page cache"
        " and each call waits on 100-odd random disk reads (the plans below read about the"
        " same number of buffers at every size). `first` = the first call after"
        " connecting.",
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
                "selector cold p50 ms",
                "first ms",
                "populated in",
            ],
            rows,
        ),
    ]
    for total, why in skipped:
        lines += ["", f"**{total:,} revisions: not measured** — {why}."]
    if peers:
        lines += ["", *peer_report(results, peers)]
    else:
        lines += [
            "",
            "**The peers were not measured** (not installed: `pip install -r"
            " bench/requirements.txt`, or left out with ATLAS_BENCH_PEERS=0).",
        ]
    lines += [
        "",
        image("history_page_vs_revisions.png", "history page time vs total revisions"),
        "",
        f"EXPLAIN ANALYZE of Atlas's page at {results[-1]['revisions']:,} revisions:",
        "",
        "```",
        results[-1]["plan"],
        "```",
    ]
    for peer in peers:
        lines += [
            "",
            f"EXPLAIN ANALYZE of {peer}'s page at {results[-1]['revisions']:,} history rows:",
            "",
            "```",
            results[-1]["peers"][peer]["plan"],
            "```",
        ]
    return "\n".join(lines)


def peer_report(results: list[dict], peers: tuple[str, ...]) -> list[str]:
    """The peers' table (Atlas's selector beside them) and what their plans read."""
    atlas0 = results[0]["selector"]["p50"]
    rows = []
    for name in ("Atlas", *peers):
        for r in results:
            m = r["selector"] if name == "Atlas" else r["peers"][name]
            own0 = (results[0]["selector"] if name == "Atlas" else results[0]["peers"][name])["p50"]
            pop = r["populated"].get(name)
            rows.append(
                [
                    name,
                    f"{r['revisions']:,}",
                    size_of(r["bytes"] if name == "Atlas" else m["bytes"]),
                    m["p50"],
                    m["p95"],
                    f"{m['p50'] / own0:.2f}×",
                    f"{m['p50'] / atlas0:.2f}×",
                    f"{m['p50'] / r['selector']['p50']:.2f}×",
                    m.get("cold_p50", float("nan")),
                    m["first"],
                    f"{pop['total_s']:.0f} s" if pop else "reused",
                ]
            )
    lines = [
        "**The peers, same databases, same run.** Each peer's history table holds the same"
        f" history ({PER_ENTITY} rows per item, the same interleaved order and timestamps),"
        " written with set-based SQL as the peer's own rows (secondary indexes dropped and"
        " rebuilt after the load; only the indexes the peer's migrations create). Each call"
        " is the peer's idiomatic newest-50 read of one item through its public API, the item"
        " loaded beforehand (untimed; Atlas's selector takes the key). Timed interleaved with"
        " Atlas's selector: every target is read by each implementation in turn, in a rotating"
        " order. Calls: "
        + "; ".join(f"{peer} `{hvp.CALLS[peer]}`" for peer in peers)
        + ". The history table size includes its indexes (django-reversion: versions and"
        " revisions).",
        "",
        table(
            [
                "implementation",
                "history rows",
                "history table(s)",
                "p50 ms",
                "p95",
                "× its smallest",
                "× Atlas smallest",
                "÷ Atlas same size",
                "cold p50 ms",
                "first ms",
                "populated in",
            ],
            rows,
        ),
        "",
        "Indexes each page reads (from EXPLAIN ANALYZE at each size):",
        "",
    ]
    for peer in peers:
        by_indexes: dict[tuple[str, ...], list[str]] = {}
        for r in results:
            used = tuple(r["peers"][peer]["indexes"])
            by_indexes.setdefault(used, []).append(f"{r['revisions']:,}")
        used = "; ".join(
            ", ".join(f"`{i}`" for i in indexes)
            + (f" (at {', '.join(at)} rows)" if len(by_indexes) > 1 else "")
            for indexes, at in by_indexes.items()
        )
        last = results[-1]["peers"][peer]
        note = ""
        if any("Seq Scan" in i for i in last["indexes"]):
            note = " — **a sequential scan at the largest size: the page grows with the table**"
        elif "Sort Key" in last["plan"] and "Presorted Key" not in last["plan"]:
            note = (
                f" — none of the peer's indexes is in the page's order: the page reads all"
                f" of the item's {PER_ENTITY} rows and sorts them, so it grows with that"
                " item's history (not with the table's)"
            )
        lines.append(f"- {peer}: {used}{note}.")
    pops = []
    for r in results:
        p = r["populated"]
        if p:
            parts = ", ".join(
                f"{k} {v['total_s']:.0f} s" for k, v in p.items() if isinstance(v, dict)
            )
            pops.append(
                f"{r['revisions']:,} rows: {parts} (two at a time; {p['wall_s']:.0f} s in all)"
            )
    if pops:
        lines += ["", "Populated this run: " + "; ".join(pops) + "."]
    return lines


if __name__ == "__main__":
    main()
