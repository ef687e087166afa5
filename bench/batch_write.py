"""Time and count the queries of 1,000-op batches through the write service.

    .venv/bin/python bench/batch_write.py [--ops 1000] [--rounds 5]

Prints the numbers and records them in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import uuid

from _setup import setup, write_section


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--singles", type=int, default=300)
    args = parser.parse_args()
    setup()

    import django
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.store import EntityKey, baseline
    from tests.entities.factories import SuperuserFactory

    actor = SuperuserFactory(username="bench-root")
    rows = []
    for phase in ("create", "update"):
        times, queries = [], []
        for _ in range(args.rounds):
            ns = Namespace.objects.create(name=f"bench.{uuid.uuid4().hex[:12]}")
            ops = [
                PutOp(EntityKey(ns.name, "item", f"i{i}"), {"n": i, "payload": "x" * 100})
                for i in range(args.ops)
            ]
            if phase == "update":
                changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE)
                ops = [PutOp(op.key, {**op.content, "n": -1}) for op in ops]
            with CaptureQueriesContext(connection) as ctx:
                start = time.perf_counter()
                changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE)
                times.append((time.perf_counter() - start) * 1000)
            queries.append(len(ctx.captured_queries))
        rows.append((phase, statistics.median(times), min(times), max(queries)))

    ns = Namespace.objects.create(name=f"bench.{uuid.uuid4().hex[:12]}")
    single = []
    for i in range(args.singles):
        start = time.perf_counter()
        changeset_apply(
            store=baseline,
            actor=actor,
            ops=[PutOp(EntityKey(ns.name, "item", f"s{i % 50}"), {"n": i})],
            rpc=Rpc.PUT_ENTITY,
        )
        single.append((time.perf_counter() - start) * 1000)
    single.sort()
    p50 = single[len(single) // 2]
    p95 = single[int(len(single) * 0.95)]

    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.node()} ({platform.machine()},"
        f" {__import__('os').cpu_count()} cores), Python {platform.python_version()},"
        f" Django {django.get_version()}, PostgreSQL {connection.pg_version // 10000}.",
        "Command: `.venv/bin/python bench/batch_write.py`"
        f" (--ops {args.ops} --rounds {args.rounds} --singles {args.singles}).",
        "",
        f"| {args.ops}-op batch | median ms | best ms | queries |",
        "|---|---|---|---|",
    ]
    for phase, median, best, count in rows:
        lines.append(f"| {phase} | {median:.1f} | {best:.1f} | {count} |")
    lines += [
        "",
        f"Single-entity PUT through the service, {args.singles} writes:"
        f" p50 {p50:.2f} ms, p95 {p95:.2f} ms.",
    ]
    text = "\n".join(lines)
    print(text)
    write_section("Write path: batches and single writes", text)


if __name__ == "__main__":
    main()
