"""What ``changeset_rare_rpc`` (migration 0022) costs a single write (issue 18).

    .venv/bin/python bench/scale_write_cost.py [--writes 2000] [--block 250]

``--writes`` single-entity writes through ``changeset_apply`` with the
partial index and as many without it (dropped and rebuilt between blocks of
``--block``, alternating, so a load spike on the shared machine hits both),
for a day-to-day rpc (PutEntity: not in the index, only its predicate is
evaluated) and for a rare one (ImportChangeset: one more b-tree insert).
Reports wall time, this process's CPU and the PostgreSQL backend's CPU per
write (medians of the blocks), on its own database ``atlas_scale_write``, into
``docs/benchmarks/scale-write-cost.md`` (``bench/scale.py --report`` shows it).
Indicative: the machine is shared.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psutil
from _common import bench_env, plots_dir
from _setup import setup

INDEX = "changeset_rare_rpc"
CREATE = (
    f"CREATE INDEX {INDEX} ON changesets_changeset (rpc, seq)"
    " WHERE NOT (rpc IN ('PutEntity', 'PatchEntity', 'BatchMutate'))"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--block", type=int, default=250)
    args = parser.parse_args()
    bench_env()
    setup(database="atlas_scale_write")
    from django.contrib.auth.models import User
    from django.db import connection

    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.store import EntityKey, baseline

    actor, _ = User.objects.get_or_create(
        username="writer", defaults={"is_superuser": True, "is_staff": True}
    )
    Namespace.objects.get_or_create(name="bench.write")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = psutil.Process(cursor.fetchone()[0])
    me = psutil.Process()
    counter = [0]

    def block(rpc: str) -> tuple[float, float, float]:
        start_wall = time.perf_counter()
        start_me = sum(me.cpu_times()[:2])
        start_pg = sum(backend.cpu_times()[:2])
        for _ in range(args.block):
            counter[0] += 1
            key = EntityKey("bench.write", "item", f"k{counter[0] % 500}")
            changeset_apply(
                store=baseline, actor=actor, ops=[PutOp(key, {"n": counter[0]})], rpc=rpc
            )
        n = args.block
        return (
            (time.perf_counter() - start_wall) * 1000 / n,
            (sum(me.cpu_times()[:2]) - start_me) * 1000 / n,
            (sum(backend.cpu_times()[:2]) - start_pg) * 1000 / n,
        )

    def set_index(present: bool) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")
            if present:
                cursor.execute(CREATE)

    for rpc in (Rpc.PUT_ENTITY, Rpc.IMPORT_CHANGESET):  # warm-up
        block(rpc)
    results: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
    for _ in range(args.writes // args.block):
        for present in (True, False):
            set_index(present)
            for rpc in (Rpc.PUT_ENTITY, Rpc.IMPORT_CHANGESET):
                results.setdefault((rpc, present), []).append(block(rpc))
    set_index(True)  # as migrated
    lines = [
        f"{args.writes:,} single-entity `changeset_apply` writes per row, in alternating"
        f" blocks of {args.block}, on a shared 2-core machine (indicative). Medians of the"
        " blocks, per write. Command: `.venv/bin/python bench/scale_write_cost.py`.",
        "",
        "| rpc | changeset_rare_rpc | wall ms | client CPU ms | PostgreSQL backend CPU ms |",
        "|---|---|---|---|---|",
    ]
    for (rpc, present), samples in results.items():
        wall, cpu, pg = (statistics.median(s[i] for s in samples) for i in range(3))
        shown = "present" if present else "absent"
        lines.append(f"| {rpc} | {shown} | {wall:.2f} | {cpu:.2f} | {pg:.2f} |")
        print(lines[-1], flush=True)
    # Part of the scale section (bench/scale.py --report includes it).
    (plots_dir() / "scale-write-cost.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
