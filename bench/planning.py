"""Planning against running: the statements of the pages that read both log tables.

    .venv/bin/python bench/planning.py [--sizes 100k,1m,10m] [--runs 9] [--only blame]
    .venv/bin/python bench/planning.py --smoke          # 2k changesets, for CI

Both log tables are range-partitioned by seq (migrations 0025 and 0038), and
PostgreSQL plans a scan of every partition a statement may read before run-time
pruning skips them: at ten million changesets (13 partitions of each table) a
page could cost more to plan than to run. For each page this times the selector
in process (p50 of ``--runs``), then re-runs every statement it sent under
``EXPLAIN (ANALYZE, SUMMARY)`` five times and reports the medians of PostgreSQL's
planning and execution times, summed over the page's statements. A statement the
page runs prepared (``atlas.db.prepared_cursor``) is explained as it runs: its
generic plan, made once per connection, then looked up.

It reads the scale benchmark's logs (``atlas_scale_<size>``, made by
``bench/scale.py --populate-only``); a size not populated is populated first.
Each size runs in a child process of its own (Django holds one database).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import bench_env, parse_part_args, part_parser
from _setup import doc_path, setup, write_section
from _sqltime import prepared as prepared_statement

SECTION = "Planning against running, page by page (issue 21, 2026-12-06)"
PAGES = [
    "history (busy entity)",
    "history by key (busy entity)",
    "blame (busy entity)",
    "revisions of a namespace",
    "revisions by key /price (mid)",
    "revisions by key /name (busy)",
    "revisions by key nothing touched (busy)",
    "changesets",
    "changesets, scoped",
    "changesets, scoped, since long ago",
    "changesets until long ago",
    "first ops of a scoped page",
    "feed from the start",
    "feed from the start, scoped",
    "changeset by id",
    "changeset by id, mid-log",
]


def _pages() -> dict[str, Callable[[], Any]]:
    import scale_populate as pop

    from changesets.selectors import blame, changeset_ops, entity_keys, feed, keys, log
    from entities.store import EntityKey, baseline

    busy = EntityKey(pop.BUSY_NS, "item", "obj-0")
    scoped = [pop.MID_NS, pop.RARE_NS]
    newest = log.changeset_list(namespaces=None, limit=1)[0]
    halfway = log.changeset_list(namespaces=None, before_seq=newest.seq // 2 + 1, limit=1)
    middle = halfway[0] if halfway else newest
    first = log.changeset_list(namespaces=None, before_seq=max(newest.seq // 50, 1) + 1, limit=1)
    old = first[0].at if first else datetime(2000, 1, 1, tzinfo=UTC)
    current = baseline.get(busy)
    content = current.content if current is not None else {}
    return {
        "history (busy entity)": lambda: log.entity_history(key=busy),
        "history by key (busy entity)": lambda: entity_keys.entity_key_history(
            key=busy, pointer="/price"
        ),
        "blame (busy entity)": lambda: blame.blame(content=content, key=busy),
        "revisions of a namespace": lambda: keys.namespace_revisions(
            where=keys.RevisionFilter(namespace=pop.MID_NS)
        ),
        "revisions by key /price (mid)": lambda: keys.namespace_revisions(
            where=keys.RevisionFilter(namespace=pop.MID_NS, key="/price")
        ),
        "revisions by key /name (busy)": lambda: keys.namespace_revisions(
            where=keys.RevisionFilter(namespace=pop.BUSY_NS, key="/name")
        ),
        "revisions by key nothing touched (busy)": lambda: keys.namespace_revisions(
            where=keys.RevisionFilter(namespace=pop.BUSY_NS, key="/nothing")
        ),
        "changesets": lambda: log.changeset_list(namespaces=None),
        "changesets, scoped": lambda: log.changeset_list(namespaces=scoped),
        "changesets, scoped, since long ago": lambda: log.changeset_list(
            namespaces=scoped, since=old
        ),
        "changesets until long ago": lambda: log.changeset_list(namespaces=None, until=old),
        "first ops of a scoped page": lambda: changeset_ops.first_ops(
            changesets=log.changeset_list(namespaces=scoped), namespaces=scoped, limit=5
        ),
        "feed from the start": lambda: feed.feed_page(after_seq=0, namespaces=None, limit=100),
        "feed from the start, scoped": lambda: feed.feed_page(
            after_seq=0, namespaces=scoped, limit=100
        ),
        "changeset by id": lambda: log.changeset_get(changeset_id=str(newest.id), namespaces=None),
        "changeset by id, mid-log": lambda: log.changeset_get(
            changeset_id=str(middle.id), namespaces=None
        ),
    }


EXPLAIN = "EXPLAIN (ANALYZE, SUMMARY, TIMING OFF) "


def _explain(sql: str, params: Any, prepared: bool = False) -> tuple[float, float]:
    """Medians of five runs' planning and execution times (ms) of one statement.

    A statement the page ran prepared (``atlas.db.prepared_cursor``) is explained as
    it runs: its generic plan, made once (a warm-up execution), then reused, so its
    planning is the cached plan's lookup."""
    from django.db import connection

    planning, execution = [], []
    with connection.cursor() as cursor, contextlib.ExitStack() as stack:
        statement, values = sql, list(params or ())
        if prepared:
            cursor.execute("SET plan_cache_mode = force_generic_plan")
            statement, values = stack.enter_context(
                prepared_statement(cursor, "bench_planning", sql, params)
            )
            cursor.execute(EXPLAIN + statement, values)  # the generic plan, made once
        for _ in range(5):
            cursor.execute(EXPLAIN + statement, values)
            out = "\n".join(row[0] for row in cursor.fetchall())
            planning.append(float(re.search(r"Planning Time: ([\d.]+)", out).group(1)))
            execution.append(float(re.search(r"Execution Time: ([\d.]+)", out).group(1)))
    return statistics.median(planning), statistics.median(execution)


def measure_size(size: str, runs: int, only: str = "") -> dict[str, Any]:
    """Every page at one size (this process's database): p50, statements, planning, running."""
    import scale

    setup(database=scale.scale_database(size))
    scale.populate(size, scale.scale_database(size))
    from django.db import connection

    from atlas.db import _PreparingCursor
    from changesets import partitions

    captured: list[tuple[str, Any, bool]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        captured.append((sql, params, isinstance(context["cursor"].cursor, _PreparingCursor)))
        return execute(sql, params, many, context)

    out: dict[str, Any] = {"partitions": len(partitions.partitions()), "pages": {}}
    for name, call in _pages().items():
        if only not in name:
            continue
        for _ in range(3):
            call()
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            call()
            times.append((time.perf_counter() - started) * 1000)
        captured.clear()
        with connection.execute_wrapper(capture):
            call()
        split = [_explain(sql, params, prepared) for sql, params, prepared in captured]
        out["pages"][name] = {
            "p50": statistics.median(times),
            "statements": len(split),
            "planning": sum(p for p, _ in split),
            "execution": sum(e for _, e in split),
        }
        print(f"  {size:5} {name:38} {out['pages'][name]}", file=sys.stderr, flush=True)
    return out


def report(results: dict[str, dict[str, Any]], argv: list[str]) -> str:
    sizes = list(results)
    head = " | ".join(f"{s} ({results[s]['partitions']} partitions)" for s in sizes)
    lines = [
        f"Command: `bench/planning.py {' '.join(argv)}`."
        f" Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {os.cpu_count()} cores;"
        f" load average {os.getloadavg()[0]:.2f} at the end.",
        "",
        "Each cell: p50 of the page in process (ms), then PostgreSQL's planning + execution",
        "summed over the page's statements (median of five `EXPLAIN ANALYZE` each; a",
        "prepared statement's generic plan, made once per connection, so its planning is",
        "the cached plan's lookup), and how many statements it sends. The logs are the",
        "scale benchmark's (`bench/scale.py`).",
        "",
        f"| page | {head} |",
        "|---|" + "---|" * len(sizes),
    ]
    for page in [p for p in PAGES if p in results[sizes[0]]["pages"]]:
        cells = []
        for size in sizes:
            r = results[size]["pages"][page]
            cells.append(
                f"{r['p50']:.1f} ({r['planning']:.2f} + {r['execution']:.2f}, {r['statements']})"
            )
        lines.append(f"| {page} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = part_parser(__doc__, smoke="2k changesets, 3 runs")
    parser.add_argument("--sizes", default="100k,1m,10m")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--only", default="", help="only the pages whose name holds this")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one size, JSON out
    args = parse_part_args(parser)
    bench_env()
    if args.one:
        print(json.dumps(measure_size(args.one, args.runs, args.only)))
        return
    sizes = ["2k"] if args.smoke else args.sizes.split(",")
    runs = 3 if args.smoke else args.runs
    results = {}
    for size in sizes:
        print(f"{size} ...", flush=True)
        child = subprocess.run(
            [sys.executable, __file__, "--one", size, "--runs", str(runs), "--only", args.only],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        sys.stderr.write(child.stderr)
        if child.returncode != 0:
            raise SystemExit(f"{size}: the child failed ({child.returncode})")
        results[size] = json.loads(child.stdout.strip().splitlines()[-1])
    body = report(results, sys.argv[1:])
    print(body)
    if not args.smoke or args.doc:
        write_section(SECTION, body)
        print(f"wrote {doc_path()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
