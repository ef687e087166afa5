"""An archive cut (issue 21, phase 1): its time, its bytes, and writers running through it.

    .venv/bin/python bench/archive.py [--smoke] [--revisions 200000] [--writers 2]
        [--batch 100] [--doc PATH] [--json PATH]

1. A fresh database (``atlas_bench_archive``) gets ``--revisions`` revisions
   through the write service (BatchMutate changesets of ``--batch`` ops over
   keys in four namespaces, about ten revisions per key), journal published.
2. ``--writers`` writer processes (multiprocessing, spawn: each its own Django
   and connection, so no GIL is shared with the archiver) write single-entity
   changesets in a loop and time each one; first for a few seconds alone
   (the baseline), then through the whole cut.
3. The archiver (the same code as ``manage.py archive_log``) cuts the first
   90% of what step 1 wrote, timing each step through its pause hook.
5. Reads at a point after the cut (the end of step 1): an as-of page, single
   entities as of it, and a history page, timed before the cut (all rows hot)
   and after it (the state at the cut beside the hot rows), with the as-of
   page's plan: the same answers, index scans on both sides.
4. Bytes: the hot log tables (heap + indexes, ``pg_total_relation_size``)
   before, after the removal and after a plain VACUUM; the archived rows' own
   size (``pg_column_size``) against the segments' bytes; the state at the
   cut. Then ``verify_archive`` (offline) and ``verify_log`` are timed.

Writes its section of docs/benchmarks.md (``--doc``/``ATLAS_BENCH_DOC``).
Writer latencies are the whole write as a client sees it (the service call,
commit included); on a shared machine they include every other process's
noise, so compare the "alone" and "during the cut" columns of one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
from typing import Any

from _common import bench_env, header, parse_part_args, part_parser, summary, table, write_json
from _setup import fresh_database, setup, write_section

TITLE = "Archive cut (issue 21, phase 1)"
# Dropped and made afresh each run; ATLAS_BENCH_DB names another (the smoke test's own).
DB = os.environ.get("ATLAS_BENCH_DB") or "atlas_bench_archive"
NAMESPACES = ("bench.a", "bench.b", "bench.c", "bench.d")
TABLES = ("changesets_changeset", "changesets_revision", "changesets_journalentry")


def writer_main(index: int, archive_dir: str, stop: Any, results: Any, ready: Any) -> None:
    """A writer process: single-entity changesets on its own keys until ``stop``."""
    os.environ["ATLAS_ARCHIVE_DIR"] = archive_dir
    setup(database=DB)
    from django.contrib.auth import get_user_model

    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.store import EntityKey, baseline

    actor = get_user_model().objects.get(username="bench")
    samples: list[tuple[float, float]] = []
    n = 0
    ready.put(index)
    while not stop.is_set():
        key = EntityKey(NAMESPACES[0], "live", f"w{index}-{n % 50}")
        started = time.perf_counter()
        changeset_apply(store=baseline, actor=actor, ops=[PutOp(key, {"n": n})], rpc=Rpc.PUT_ENTITY)
        samples.append((time.time(), (time.perf_counter() - started) * 1000))
        n += 1
    results.put(samples)


def _partitions(changesets: int) -> None:
    """Lay the empty log tables out so that the 90% cut (``_measure``) ends where a
    partition ends: nine partitions through it, one after (the cut drops nine)."""
    from changesets import repartition

    through = int(changesets * 0.9)
    bounds = sorted({i * (through + 1) // 9 for i in range(9)} | {through + 1})
    ranges = [*zip(bounds, bounds[1:], strict=False), (through + 1, changesets + 1_000_000)]
    repartition.lay_out(ranges)


def populate(revisions: int, batch: int) -> dict[str, float]:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.store import EntityKey, baseline

    actor = get_user_model().objects.create_superuser("bench", "bench@example.test", "x")
    for name in NAMESPACES:
        Namespace.objects.get_or_create(name=name)
    keys = max(revisions // 10, batch)
    _partitions(revisions // batch)
    started = time.perf_counter()
    for n in range(revisions // batch):
        ops = [
            PutOp(
                EntityKey(NAMESPACES[(n + i) % 4], "doc", f"k{(n * batch + i) % keys}"),
                {"n": n, "i": i, "title": f"document {i}", "body": "x" * 120},
            )
            for i in range(batch)
        ]
        changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE)
    seconds = time.perf_counter() - started
    with connection.cursor() as cursor:  # no relay runs here: publish (delete) as it would
        cursor.execute("DELETE FROM changesets_journalentry")
        cursor.execute("VACUUM ANALYZE")
    return {"seconds": seconds, "keys": keys}


def sizes() -> dict[str, dict[str, int]]:
    """Per table: rows, the rows' own bytes (``pg_column_size``) and bytes on disk."""
    from django.db import connection

    out = {}
    with connection.cursor() as cursor:
        for name in (*TABLES, "changesets_archivebase"):
            cursor.execute(
                f"SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0),"
                # (summed over its partitions: a partitioned table has no storage of its own)
                f" (SELECT sum(pg_total_relation_size(r))::bigint"
                f" FROM (SELECT '{name}'::regclass AS r"
                f" UNION ALL SELECT inhrelid::regclass FROM pg_inherits"
                f" WHERE inhparent = '{name}'::regclass) p)"
                f" FROM {name} t"
            )
            rows, live, disk = cursor.fetchone()
            out[name] = {"rows": rows, "live": int(live), "disk": disk}
    return out


def row_bytes(through: int) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT coalesce(sum(pg_column_size(c.*)), 0) FROM changesets_changeset c"
            "  WHERE seq <= %s) + (SELECT coalesce(sum(pg_column_size(r.*)), 0)"
            "  FROM changesets_revision r WHERE seq <= %s)",
            [through, through],
        )
        return int(cursor.fetchone()[0])


class LockWaits:
    """Samples, every 10 ms on a connection of its own, the backends of the benchmark
    database waiting for a lock, and who blocks them (``pg_blocking_pids``): the
    question is whether a writer ever waits for the archiver's session. Writers wait
    for each other on the log head (one commit at a time: invariant 6) whether or not
    a cut runs; those waits are counted apart."""

    def __init__(self, url: str, archiver_pid: int) -> None:
        import threading

        self.url, self.archiver_pid, self.stop = url, archiver_pid, threading.Event()
        # (at, waiting, longest ms, waiting on the archiver, longest ms on it, kinds)
        self.found: list[tuple[float, int, float, int, float, str]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(
                    "WITH w AS (SELECT pid, wait_event,"
                    "  extract(epoch FROM now() - query_start) * 1000 AS ms,"
                    "  %s = ANY(pg_blocking_pids(pid)) AS on_archiver"
                    "  FROM pg_stat_activity WHERE datname = current_database()"
                    "  AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())"
                    " SELECT count(*), coalesce(max(ms), 0), count(*) FILTER (WHERE on_archiver),"
                    " coalesce(max(ms) FILTER (WHERE on_archiver), 0),"
                    " coalesce(string_agg(DISTINCT wait_event, ','), '') FROM w",
                    [self.archiver_pid],
                ).fetchone()
                self.found.append(
                    (time.time(), row[0], float(row[1]), row[2], float(row[3]), row[4])
                )
                time.sleep(0.01)

    def between(self, start: float, end: float) -> dict[str, Any]:
        window = [f for f in self.found if start <= f[0] <= end]
        return {
            "samples": len(window),
            "waiting": sum(1 for f in window if f[1]),
            "longest_ms": max((f[2] for f in window), default=0.0),
            "on_archiver": sum(1 for f in window if f[3]),
            "longest_on_archiver_ms": max((f[4] for f in window), default=0.0),
            "locks": sorted({k for f in window for k in f[5].split(",") if k}),
        }

    def __enter__(self) -> LockWaits:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def run_cut(through: int, point: int) -> tuple[dict[str, float], dict[str, Any]]:
    """The archiver, timed step by step (its pause hook marks each step's end), and the
    read comparison made at the switch (its time left out of the steps')."""
    from changesets.archive import archiver

    marks = [("start", time.perf_counter())]
    compared: dict[str, Any] = {}

    def mark(name: str) -> None:
        if name in ("planned", "written", "verified", "signed", "switched", "removed"):
            marks.append((name, time.perf_counter()))
        if name == "switched":
            started = time.perf_counter()
            compared.update(compare_reads(point))
            compared["seconds"] = time.perf_counter() - started

    archiver.archive(before=through + 1, requested_by="bench", pause=mark)
    steps = {b[0]: b[1] - a[1] for a, b in zip(marks, marks[1:], strict=False)}
    steps["removed"] -= compared.get("seconds", 0.0)
    steps["total"] = marks[-1][1] - marks[0][1] - compared.get("seconds", 0.0)
    return steps, compared


def main() -> None:
    parser = part_parser(__doc__)
    parser.add_argument("--revisions", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--writers", type=int, default=2)
    args = parse_part_args(parser)
    revisions = 2_000 if args.smoke else args.revisions
    bench_env()
    archive_dir = tempfile.mkdtemp(prefix="atlas-bench-archive-")
    os.environ.update({
        "ATLAS_ARCHIVE_DIR": archive_dir,
        "ATLAS_ARCHIVE_GRACE_SECONDS": "5",
        "ATLAS_ARCHIVE_SIGNING_KEY": os.environ.get("ATLAS_ARCHIVE_SIGNING_KEY")
        or _new_key(),
    })  # fmt: skip
    fresh_database(DB)
    setup(database=DB)
    filled = populate(revisions, args.batch)
    result = _measure(args, archive_dir, filled)
    write_json(args.json, result)
    write_section(TITLE, _report(result, args))
    print(_report(result, args))


def _new_key() -> str:
    from changesets.archive import signing

    return signing.new_private_key()


def _measure(args: argparse.Namespace, archive_dir: str, filled: dict[str, float]) -> dict:
    from django.db import connection

    from changesets.archive.models import ArchiveCut
    from changesets.models import LogHead

    point = LogHead.objects.get().seq
    through = int(point * 0.9)
    before, archived_rows = sizes(), row_bytes(through)
    context = mp.get_context("spawn")
    stop, results, ready = context.Event(), context.Queue(), context.Queue()
    writers = [
        context.Process(target=writer_main, args=(i, archive_dir, stop, results, ready))
        for i in range(args.writers)
    ]
    for writer in writers:
        writer.start()
    for _ in writers:
        ready.get(timeout=120)  # each writer has set Django up
    with connection.cursor() as cursor:  # the archiver runs on this process's session
        cursor.execute("SELECT pg_backend_pid()")
        archiver_pid = cursor.fetchone()[0]
    with LockWaits(os.environ["DATABASE_URL"], archiver_pid) as waits:
        alone_started = time.time()
        time.sleep(2 if args.smoke else 10)  # the writers alone: the baseline
        cut_started = time.time()
        steps, compared = run_cut(through, point)
        cut_ended = time.time()
    time.sleep(1)
    stop.set()
    samples = [s for _ in writers for s in results.get(timeout=60)]
    for writer in writers:
        writer.join(timeout=30)
    alone = [ms for at, ms in samples if at < cut_started]
    during = [ms for at, ms in samples if cut_started <= at <= cut_ended]
    after = sizes()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    vacuumed = sizes()
    compared["settled"] = settled_reads(point)
    cut = ArchiveCut.objects.get()
    segment_bytes = sum(cut.segments.values_list("bytes", flat=True))
    verify_archive_s = _timed_command("verify_archive", archive_dir, "--no-progress")
    verify_log_s = _timed_command("verify_log", "--no-progress")
    return {
        "revisions": cut.revisions, "changesets": cut.changesets, "keys": filled["keys"],
        "populate_s": filled["seconds"], "batch": args.batch, "steps_s": steps,
        "segments": cut.segments.count(),
        "segment_bytes": segment_bytes, "archived_row_bytes": archived_rows,
        "sizes": {"before": before, "after_removal": after, "after_vacuum": vacuumed},
        "writers": args.writers, "alone_ms": summary(alone), "during_ms": summary(during),
        "verify_archive_s": verify_archive_s, "verify_log_s": verify_log_s,
        "reads": compared,
        "lock_waits": {"alone": waits.between(alone_started, cut_started),
                       "cut": waits.between(cut_started, cut_ended)},
    }  # fmt: skip


def _reads(point: int) -> dict[str, Any]:
    from changesets.selectors import asof
    from changesets.selectors.log import entity_history
    from entities.store import EntityKey

    keys = [EntityKey(NAMESPACES[i % 4], "doc", f"k{i * 7}") for i in range(20)]
    return {
        "as-of page (50)": lambda: asof.entities_as_of(
            seq=point, namespaces=None, namespace=NAMESPACES[1], limit=50
        ),
        "20 entities as of": lambda: [asof.entity_as_of(seq=point, key=k) for k in keys],
        "history page (50)": lambda: entity_history(key=keys[0], limit=50),
    }


def settled_reads(point: int) -> dict[str, Any]:
    """The same reads once the rows are removed and the writers stopped (ms)."""
    from _common import repeat_ms

    return {name: summary(repeat_ms(read, 40, seconds=15)) for name, read in _reads(point).items()}


def compare_reads(point: int) -> dict[str, Any]:
    """At the switch (every row still hot, reads moved to the cut): the same reads at
    ``point`` the way they ran before the cut (the revisions alone) and the way they run
    after it (the state at the cut beside the hot revisions), interleaved, so load on
    the machine hits both alike; their answers, and the as-of page's sequential scans."""
    from _common import interleaved_ms
    from django.db import connection

    from changesets.archive import boundary
    from changesets.selectors import asof

    cut = boundary.current()
    reads = _reads(point)

    def under(state: Any, fn: Any) -> Any:
        boundary.prime(state)
        try:
            return fn()
        finally:
            boundary.prime(cut)

    out: dict[str, Any] = {"times": {}, "same": True, "seq_scans": {}}
    for name, read in reads.items():
        if name != "history page (50)":  # history ends at the cut: another answer, by design
            hot, cutting = under(None, read), under(cut, read)
            out["same"] = out["same"] and _comparable(hot) == _comparable(cutting)
        out["times"][name] = {
            label: summary(samples)
            for label, samples in interleaved_ms(
                {"before": lambda r=read: under(None, r), "after": lambda r=read: under(cut, r)},
                40,
                seconds=15,
            ).items()
        }
    for label, state in (("before", None), ("after", cut)):
        boundary.prime(state)
        sql = asof._statement("namespace = %s", point) % (
            point, f"'{NAMESPACES[1]}'", 82, point,
        )  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
            plan = cursor.fetchone()[0]
        plan = plan if isinstance(plan, list) else json.loads(plan)
        out["seq_scans"][label] = _seq_scans(plan[0]["Plan"])
    boundary.forget()
    return out


def _comparable(result: Any) -> Any:
    if isinstance(result, list):
        return [_comparable(x) for x in result]
    if result is None:
        return None
    return (result.key, result.content, result.version, result.updated_at, result.created_at)


def _seq_scans(node: dict[str, Any]) -> list[str]:
    found = [node["Relation Name"]] if node["Node Type"] == "Seq Scan" else []
    for child in node.get("Plans", []):
        found += _seq_scans(child)
    return found


def _timed_command(*args: str) -> float:
    from io import StringIO

    from django.core.management import call_command

    started = time.perf_counter()
    call_command(*args, stdout=StringIO(), stderr=StringIO())
    return time.perf_counter() - started


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def _report(r: dict, args: argparse.Namespace) -> str:
    command = (
        f"bench/archive.py --revisions {args.revisions} --batch {args.batch}"
        f" --writers {args.writers}"
    )
    steps = r["steps_s"]

    def cell(at: str, name: str) -> str:
        one = r["sizes"][at][name]
        return f"{one['rows']:,} rows, {_mib(one['live'])} / {_mib(one['disk'])}"

    hot = [
        [name, cell("before", name), cell("after_removal", name), cell("after_vacuum", name)]
        for name in (*TABLES, "changesets_archivebase")
    ]
    lat = [
        [label, s["n"], s["p50"], s["p99"], s["max"]]
        for label, s in (("alone", r["alone_ms"]), ("during the cut", r["during_ms"]))
    ]
    return "\n\n".join([
        header(command),
        f"Written through the write service (in {r['populate_s']:.0f} s): batches of"
        f" {r.get('batch', 100):,} ops"
        f" over {r['keys']:,} keys; the first {r['revisions']:,} revisions"
        f" ({r['changesets']:,} changesets, 90%) cut in one go, the rest left hot for the"
        " reads below.",
        table(["step (its end)", "seconds"], [[k, v] for k, v in steps.items()]),
        "(`removed`: the partitions of both log tables through the cut detached and"
        " dropped, a partition straddling the cut emptied by batched DELETE, and what"
        " was left of the grace,"
        " `ATLAS_ARCHIVE_GRACE_SECONDS`=5, after the read comparison made at the switch, whose"
        " time is left out.)",
        f"Segments: {r['segments']} files, {_mib(r['segment_bytes'])} gzipped NDJSON, for"
        f" {_mib(r['archived_row_bytes'])} of archived rows (`pg_column_size`, before TOAST"
        f" compression), {r['archived_row_bytes'] / max(r['segment_bytes'], 1):.1f}× smaller.",
        "Hot tables: rows, their own bytes (`pg_column_size`) / bytes on disk (heap +"
        " indexes + TOAST, `pg_total_relation_size`, summed over partitions). After the"
        " removal the tables hold the writers' changesets of the run. Revisions and"
        " changesets go by dropping whole partitions (migrations 0025 and 0038), which"
        " returns their space at once; only a partition straddling the cut is emptied by"
        " batched DELETE, and keeps its file until new rows reuse the space (a plain"
        " VACUUM makes it reusable).",
        table(["table", "before", "after removal", "after VACUUM"], hot),
        f"{r['writers']} writer process{'es' if r['writers'] != 1 else ''}, single-entity"
        " changesets, ms per write:",
        table(["writers", "writes", "p50", "p99", "max"], lat),
        "Lock waits (`pg_stat_activity` and `pg_blocking_pids`, sampled every 10 ms): how"
        " often a backend waited for a lock, for how long its statement had run, and how"
        " often (and how long) one waited for the archiver's session. The writers wait for"
        " each other on the log head (one commit at a time, invariant 6), with or without"
        " a cut.",
        table(
            ["", "samples", "waiting", "longest (ms)", "waiting on the archiver",
             "longest on it (ms)", "locks"],
            [
                [label, w["samples"], w["waiting"], w["longest_ms"], w["on_archiver"],
                 w["longest_on_archiver_ms"], ", ".join(w["locks"]) or "–"]
                for label, w in (("writers alone", r["lock_waits"]["alone"]),
                                 ("during the cut", r["lock_waits"]["cut"]))
            ],
        ),
        "Write latency beyond the lock waits is CPU: the writers, the archiver and"
        " PostgreSQL share the machine's cores.",
        f"Offline `verify_archive`: {r['verify_archive_s']:.1f} s; `verify_log` from the"
        f" checkpoint: {r['verify_log_s']:.1f} s.",
        "Reads at a point after the cut, timed at the switch (every row still hot) the way"
        " they ran before the cut (the revisions alone) and the way they run after it (the"
        " state at the cut beside the hot revisions), interleaved, ms; answers"
        f" of the as-of reads {'identical' if r['reads']['same'] else 'DIFFERENT'} (history"
        " ends at the cut); sequential scans in the"
        f" as-of page's plan: before {r['reads']['seq_scans']['before'] or 'none'}, after"
        f" {r['reads']['seq_scans']['after'] or 'none'}:",
        table(["read", "before p50", "before p99", "after p50", "after p99",
               "removed p50", "removed p99"], [
            [name, t["before"]["p50"], t["before"]["p99"], t["after"]["p50"], t["after"]["p99"],
             r["reads"]["settled"][name]["p50"], r["reads"]["settled"][name]["p99"]]
            for name, t in r["reads"]["times"].items()
        ]),
        "(\"removed\": the same reads after the removal, writers stopped, not interleaved;"
        " at the switch the hot arm still skips the rows through the cut in its index.)",
        "The cut's cost is mostly Python (member digests, JSON, gzip), linear in"
        f" revisions: {r['revisions'] / max(steps['written'], 1e-9):,.0f} revisions a second"
        f" written and {r['revisions'] / max(steps['verified'], 1e-9):,.0f} read back and"
        " verified here, on 2 cores shared with the writers.",
    ])  # fmt: skip


if __name__ == "__main__":
    main()
