"""Write throughput ceiling: one log head, 1–16 concurrent writers (issue 20).

    .venv/bin/python bench/write_ceiling.py [--smoke] [--seconds 10] [--writers 1,2,4,8,16]
        [--modes direct,pgbouncer,async] [--pool-size 8] [--doc PATH] [--plots DIR] [--json PATH]

Every Atlas changeset updates the one-row log head to draw ``seq``; that row's
lock is held from the log statement's head update to the end of COMMIT, which
includes the WAL flush, so changesets commit one at a time (DESIGN invariant 6).
This measures what that costs:

1. N writer processes (multiprocessing, spawn: each its own Django and
   connection) at each writer count, each writing single-entity changes to
   its own keys (no row contention) through ``changeset_apply`` for
   ``--seconds``; then the same processes for as long doing a plain ORM
   get()+save() of ``PlainItem`` (no global order). Writes/s, p50/p99 ms.
2. Modes: ``direct`` (PostgreSQL itself); ``pgbouncer`` (a PgBouncer of this
   run in ``pool_mode = transaction``, ``--pool-size`` server connections,
   ``ATLAS_DB_POOLING=transaction`` in the writers; skipped, saying why, without
   the binary); ``async`` (direct, ``SET synchronous_commit = off`` in the
   writers' sessions: the documented lever).
3. Why it flattens: per write, client-side, the log statement's time, the
   time from its end to COMMIT (Python inside the hold) and COMMIT's time
   (both 0 for Atlas's single write outside a transaction, whose log statement
   commits as it ends: its time includes the flush);
   the server's cost of a WAL flush (a probe session's COMMIT with
   ``synchronous_commit`` on and off, its ``pg_stat_wal`` sync time under
   ``track_wal_io_timing``, and ``pg_test_fsync`` on the data directory's
   filesystem when the server is on this machine). Ceiling ≈ 1 / hold.

Writes its section of docs/benchmarks.md (``--doc``/``ATLAS_BENCH_DOC``
redirect it) and ``write_ceiling.png`` (writes/s vs writers, one line per mode,
plus plain) into docs/benchmarks/ (``--plots``/``ATLAS_BENCH_PLOTS``).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from queue import Empty
from typing import Any

from _common import (
    bench_env,
    database,
    header,
    image,
    parse_part_args,
    part_parser,
    plot,
    summary,
    table,
    write_json,
)
from _setup import setup, write_section

TITLE = "Write throughput ceiling: one log head, 1–16 writers (issue 20)"
KEYS_PER_WRITER = 10
PAYLOAD = "x" * 100
MODES = {
    "direct": "direct",
    "pgbouncer": "PgBouncer, transaction mode",
    "async": "direct, synchronous_commit=off",
}
READY_TIMEOUT = 180  # seconds for a writer process to start Django on a busy machine


def content(n: int) -> dict[str, Any]:
    return {"n": n, "payload": PAYLOAD}


# --- the writer processes ------------------------------------------------------------


def writer_main(index: int, config: dict[str, Any], commands: Any, results: Any) -> None:
    """One writer process: Django on ``config['env']``, then blocks on command.

    A command is ``(kind, start_at, seconds)``: write ``kind`` ("atlas" or
    "plain") to this writer's own keys from ``start_at`` (time.monotonic, the
    same clock in every process) for ``seconds``; the answer is one sample per
    write that finished inside the window.
    """
    try:
        os.environ.update(config["env"])
        import django

        django.setup()
        _writer_loop(index, config, commands, results)
    except BaseException as exc:  # the parent must hear of it, not wait forever
        results.put(("error", index, repr(exc)))


def _writer_loop(index: int, config: dict[str, Any], commands: Any, results: Any) -> None:
    from django.contrib.auth.models import User
    from django.db import connections, transaction
    from django.db.backends.signals import connection_created

    import changesets.services.apply as apply_module
    from bench.plain.models import PlainItem
    from changesets.models import Rpc
    from changesets.ops import PutOp
    from entities.store import EntityKey, baseline

    session_sql = config.get("session_sql")
    if session_sql:

        def on_connect(connection: Any, **_kw: Any) -> None:
            with connection.cursor() as cursor:
                cursor.execute(session_sql)

        connection_created.connect(on_connect, weak=False)

    # Client-side marks: the log statement (_write_log: entity rows, head, log rows,
    # one round trip) and COMMIT. The head's lock is held from inside the first to
    # the end of the second, so stmt_end → commit_start is Python inside the hold.
    marks: dict[str, float] = {}
    write_log = apply_module._write_log

    def timed_write_log(*args: Any, **kwargs: Any) -> Any:
        marks["stmt0"] = time.perf_counter()
        try:
            return write_log(*args, **kwargs)
        finally:
            marks["stmt1"] = time.perf_counter()

    apply_module._write_log = timed_write_log  # type: ignore[assignment]
    db = connections["default"]
    commit = db._commit

    def timed_commit() -> Any:
        marks["commit0"] = time.perf_counter()
        try:
            return commit()
        finally:
            marks["commit1"] = time.perf_counter()

    db._commit = timed_commit  # type: ignore[method-assign]

    actor = User.objects.get(username=config["actor"])
    ns, plain_ns = config["namespace"], config["plain_namespace"]
    slugs = [f"w{index}-k{k}" for k in range(KEYS_PER_WRITER)]
    counter = iter(range(10**9))

    def atlas_write(n: int) -> None:
        key = EntityKey(ns, "item", slugs[n % KEYS_PER_WRITER])
        apply_module.changeset_apply(
            store=baseline, actor=actor, ops=[PutOp(key, content(n))], rpc=Rpc.PUT_ENTITY
        )

    def plain_write(n: int) -> None:
        with transaction.atomic():
            obj = PlainItem.objects.get(namespace=plain_ns, slug=slugs[n % KEYS_PER_WRITER])
            obj.content = content(n)
            obj.save()

    writes = {"atlas": atlas_write, "plain": plain_write}
    for fn in writes.values():  # connection, prepared statements, caches
        for _ in range(3):
            fn(next(counter))
    results.put(("ready", index, None))
    while True:
        command = commands.get()
        if command is None:
            break
        kind, start_at, seconds = command
        fn = writes[kind]
        fn(next(counter))  # warm after the idle wait
        samples: list[tuple[float, float, float, float]] = []
        end_at = start_at + seconds
        time.sleep(max(0.0, start_at - time.monotonic()))
        while True:
            marks.clear()
            t0 = time.perf_counter()
            fn(next(counter))
            t1 = time.perf_counter()
            if time.monotonic() > end_at:
                break
            stmt = marks.get("stmt1", t0) - marks.get("stmt0", t0)
            if "commit0" in marks:
                gap = marks["commit0"] - marks.get("stmt1", marks["commit0"])
                commit_ms = marks["commit1"] - marks["commit0"]
            else:  # the unlocked single write: its log statement committed as it ended
                gap = commit_ms = 0.0
            samples.append(((t1 - t0) * 1000, stmt * 1000, gap * 1000, commit_ms * 1000))
        results.put(("done", index, samples))


class Writers:
    """``count`` writer processes on one configuration, started and stopped together."""

    def __init__(self, count: int, config: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")  # a fresh Django per process: no shared sockets
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(count)]
        self.processes = [
            ctx.Process(
                target=writer_main, args=(i, config, self.commands[i], self.results), daemon=True
            )
            for i in range(count)
        ]
        for process in self.processes:
            process.start()
        self._collect(count, "ready")

    def _collect(self, count: int, kind: str, timeout: float = READY_TIMEOUT) -> list[Any]:
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            try:
                tag, index, payload = self.results.get(
                    timeout=max(0.1, deadline - time.monotonic())
                )
            except Empty:
                raise RuntimeError(f"writers did not report {kind!r} in {timeout:.0f} s") from None
            if tag == "error":
                raise RuntimeError(f"writer {index} failed: {payload}")
            if tag == kind:
                out.append(payload)
        return out

    def run(self, kind: str, n: int, seconds: float) -> list[tuple[float, float, float, float]]:
        """Writers 0..n-1 write ``kind`` together for ``seconds``; every sample."""
        start_at = time.monotonic() + 0.5
        for queue in self.commands[:n]:
            queue.put((kind, start_at, seconds))
        per_writer = self._collect(n, "done", timeout=seconds + 120)
        return [s for samples in per_writer for s in samples]

    def close(self) -> None:
        for queue in self.commands:
            with contextlib.suppress(Exception):
                queue.put(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)


# --- the server's flush cost -----------------------------------------------------------


# One row in the benchmark database: a transaction must write WAL before its commit
# record for COMMIT to flush (taking an xid alone commits asynchronously).
PROBE_TABLE = "CREATE TABLE IF NOT EXISTS bench_ceiling_probe (id int PRIMARY KEY, n bigint)"
PROBE_WRITE = (
    "INSERT INTO bench_ceiling_probe VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n"
)


def flush_probe(url: str, count: int) -> dict[str, Any]:
    """COMMIT of a one-row upsert, ``count`` times with synchronous_commit on and off:
    the difference is the WAL flush the first waits for. With ``track_wal_io_timing``
    on in this session (superuser only), pg_stat_wal's ``wal_sync_time`` grows by this
    session's fsyncs alone (the counter ``wal_sync`` counts the whole cluster's, so it
    is not used as the divisor)."""
    import psycopg

    out: dict[str, Any] = {}
    with psycopg.connect(url) as conn:
        conn.execute(PROBE_TABLE)
        conn.commit()
        timing = True
        try:
            conn.execute("SET track_wal_io_timing = on")
            conn.commit()
        except psycopg.Error:
            conn.rollback()
            timing = False
        out["track_wal_io_timing"] = timing
        for sync, notify in (("on", False), ("off", False), ("on", True)):
            conn.execute(f"SET synchronous_commit = {sync}")
            conn.commit()
            before = _wal_sync_time(conn) if timing else None
            samples = []
            for n in range(count):
                conn.execute(PROBE_WRITE, [n])
                if notify:  # what the journal trigger adds to COMMIT (nobody listens here)
                    conn.execute("SELECT pg_notify('atlas_bench_probe', '')")
                t0 = time.perf_counter()
                conn.commit()
                samples.append((time.perf_counter() - t0) * 1000)
            after = _wal_sync_time(conn) if timing else None
            label = sync + ("_notify" if notify else "")
            out[f"commit_{label}"] = summary(samples)
            if before is not None and after is not None:
                out[f"sync_ms_per_commit_{label}"] = (after - before) / count
    return out


def _wal_sync_time(conn: Any) -> float | None:
    """This cluster's pg_stat_wal.wal_sync_time (ms), with this session's stats flushed."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.commit()  # going idle flushes this backend's pending WAL stats
    row = conn.execute("SELECT pg_stat_clear_snapshot(), wal_sync_time FROM pg_stat_wal").fetchone()
    conn.commit()
    return float(row[1]) if row else None


def pg_test_fsync(url: str) -> dict[str, Any]:
    """``pg_test_fsync`` on the data directory's filesystem (the server's binary), one
    8 kB write + the server's wal_sync_method; {} with the reason when it cannot run."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        method = conn.execute("SHOW wal_sync_method").fetchone()[0]
        try:
            data_dir = conn.execute("SHOW data_directory").fetchone()[0]
        except psycopg.Error:
            return {"skipped": "not allowed to read data_directory (not a superuser)"}
        bindir = conn.execute("SELECT setting FROM pg_config WHERE name = 'BINDIR'").fetchone()
    binary = Path(bindir[0]) / "pg_test_fsync" if bindir else None
    if binary is None or not binary.exists():
        found = shutil.which("pg_test_fsync")
        binary = Path(found) if found else None
    if binary is None:
        return {"skipped": "pg_test_fsync not found"}
    try:
        device = os.stat(data_dir).st_dev
    except OSError:
        return {"skipped": f"the server's data directory {data_dir} is not on this machine"}
    scratch = Path(tempfile.gettempdir())
    if os.stat(scratch).st_dev != device:
        scratch = Path(data_dir).parent  # never inside the data directory itself
    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        proc = subprocess.run(
            [str(binary), "-s", "1", "-f", str(Path(folder) / "fsync.tmp")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if proc.returncode != 0:
        return {"skipped": f"pg_test_fsync failed: {proc.stderr.strip()[:200]}"}
    # The first section: one 8 kB write per sync, by method.
    for line in proc.stdout.splitlines():
        m = re.match(rf"\s+{re.escape(method)}\s+([\d.]+) ops/sec\s+(\d+) usecs/op", line)
        if m:
            return {"method": method, "ops": float(m.group(1)), "usecs": int(m.group(2))}
    return {"skipped": f"no {method} line in pg_test_fsync's output"}


def statement_breakdown(base: dict[str, str], count: int) -> dict[str, Any]:
    """The log statement's parts as the server times them: ``auto_explain`` (analyze,
    JSON, triggers) in this process's session, its plans sent back as notices
    (``client_min_messages = log``), over ``count`` single-entity writes on one
    connection. Each data-modifying CTE is a ModifyTable node: ``eu``/``ei``/``ed``
    (entity rows) run before ``h`` (the head update: the lock is taken here);
    ``c``, ``j`` (and its NOTIFY trigger) and ``r`` run after it, inside the hold.
    Per-node timing inflates every figure a little; the split is what counts."""
    from django.contrib.auth.models import User
    from django.db import connection

    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.store import EntityKey, baseline

    actor = User.objects.get(username=base["actor"])
    key = EntityKey(base["namespace"], "item", "w0-k0")
    connection.ensure_connection()
    notes: list[str] = []
    raw = connection.connection
    raw.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
    settings = (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_analyze = on",
        "SET auto_explain.log_triggers = on",
        "SET auto_explain.log_format = json",
        "SET client_min_messages = log",
    )
    try:
        with connection.cursor() as cursor:
            for sql in settings:
                cursor.execute(sql)
    except Exception as exc:  # auto_explain needs a superuser (LOAD) and the contrib module
        connection.close()
        return {"skipped": f"auto_explain unavailable: {exc}"}
    parts: dict[str, list[float]] = {}
    try:
        for n in range(count + 3):
            notes.clear()
            changeset_apply(
                store=baseline, actor=actor, ops=[PutOp(key, content(n))], rpc=Rpc.PUT_ENTITY
            )
            if n < 3:
                continue  # the first plans of a connection
            for note in notes:
                if "changesets_loghead" not in note or "plan:" not in note:
                    continue
                plan = json.loads(note.split("plan:", 1)[1])
                found: dict[str, float] = {}
                _cte_times(plan["Plan"], found)
                found["NOTIFY trigger"] = sum(t["Time"] for t in plan.get("Triggers", ()))
                found["statement"] = float(note.split("duration:", 1)[1].split("ms", 1)[0])
                for name, ms in found.items():
                    parts.setdefault(name, []).append(ms)
    finally:
        connection.close()  # auto_explain stays with that session
    return {name: summary(values)["p50"] for name, values in parts.items()}


def _cte_times(node: dict[str, Any], out: dict[str, float]) -> None:
    name = node.get("Subplan Name", "")
    if node.get("Node Type") == "ModifyTable" and name.startswith("CTE "):
        out[name[4:]] = float(node["Actual Total Time"])
    for child in node.get("Plans", ()):
        _cte_times(child, out)


def head_state() -> dict[str, Any]:
    """The log head's table: dead row versions, size, and the cluster's oldest snapshot.

    Every seq draw leaves a dead version of the one head row. Pruning removes them
    only when no snapshot anywhere in the cluster is older (a long transaction in
    any database, a replica's hot_standby_feedback, a replication slot's xmin), and
    until then each draw's index scan walks past them."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_dead_tup, pg_relation_size(relid), (SELECT max(age(backend_xmin))"
            " FROM pg_stat_activity) FROM pg_stat_user_tables WHERE relname = 'changesets_loghead'"
        )
        dead, size, xmin_age = cursor.fetchone()
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)"
            " SELECT seq FROM changesets_loghead WHERE id = 1"
        )
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    root = plan[0]["Plan"]
    return {
        "dead": dead,
        "bytes": size,
        "oldest_xmin_age": xmin_age,
        "read_ms": plan[0]["Execution Time"],
        "buffers": root.get("Shared Hit Blocks", 0) + root.get("Shared Read Blocks", 0),
    }


# --- orchestration ---------------------------------------------------------------------


def populate(rid: str, writers: int) -> dict[str, str]:
    """A superuser actor (no role lookups: the hold, not authorization, is measured),
    ``KEYS_PER_WRITER`` Atlas entities and plain rows per writer."""
    from bench.plain.models import PlainItem
    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.store import EntityKey, baseline
    from tests.entities.factories import SuperuserFactory

    actor = SuperuserFactory(username=f"bench-ceiling-{rid}")
    ns = Namespace.objects.create(name=f"bench.ceiling{rid}")
    slugs = [f"w{w}-k{k}" for w in range(writers) for k in range(KEYS_PER_WRITER)]
    changeset_apply(
        store=baseline,
        actor=actor,
        ops=[PutOp(EntityKey(ns.name, "item", s), content(0)) for s in slugs],
        rpc=Rpc.BATCH_MUTATE,
    )
    plain_ns = f"ceiling-{rid}"
    PlainItem.objects.bulk_create(
        [PlainItem(namespace=plain_ns, slug=s, content=content(0)) for s in slugs]
    )
    return {"actor": actor.username, "namespace": ns.name, "plain_namespace": plain_ns}


def _bouncer(settings_dict: dict[str, Any], pool_size: int) -> Any:
    """tests/pgbouncer.py's PgBouncer (its ini, its start), with this run's pool size."""
    from tests import pgbouncer

    class BenchBouncer(pgbouncer.PgBouncer):
        def ini(self) -> str:
            default = f"default_pool_size = {pgbouncer.POOL_SIZE}"
            return super().ini().replace(default, f"default_pool_size = {pool_size}")

    return BenchBouncer(dict(settings_dict)).start()


def measure_mode(
    mode: str,
    levels: list[int],
    seconds: float,
    base: dict[str, Any],
    url: str,
    pool_size: int,
) -> dict[str, Any]:
    """Every writer count in ``levels``, Atlas then plain (plain then Atlas on odd
    levels, so a drift in the machine's load does not always favour one)."""
    from django.db import connection

    env = {"DATABASE_URL": url, "ATLAS_DB_POOLING": ""}
    bouncer = None
    if mode == "pgbouncer":
        from tests import pgbouncer

        if pgbouncer.binary() is None:
            return {"skipped": pgbouncer.MISSING}
        bouncer = _bouncer(connection.settings_dict, pool_size)
        env.update(DATABASE_URL=bouncer.url(), ATLAS_DB_POOLING="transaction")
    config = {**base, "env": env}
    if mode == "async":
        config["session_sql"] = "SET synchronous_commit = off"
    out: dict[str, Any] = {"atlas": {}, "plain": {}}
    writers = None
    try:
        writers = Writers(max(levels), config)
        for i, n in enumerate(levels):
            for kind in ("atlas", "plain") if i % 2 == 0 else ("plain", "atlas"):
                samples = writers.run(kind, n, seconds)
                out[kind][n] = _block(samples, seconds)
                b = out[kind][n]
                print(
                    f"  {mode} {kind} x{n}: {b['rate']:,.0f} writes/s, p50 {b['p50']:.2f} ms,"
                    f" p99 {b['p99']:.2f} ms; stmt {b['stmt']:.2f}, gap {b['gap']:.3f},"
                    f" commit {b['commit']:.2f} ms (p50)",
                    flush=True,
                )
    finally:
        if writers is not None:
            writers.close()
        if bouncer is not None:
            bouncer.stop()
    return out


def _block(samples: list[tuple[float, float, float, float]], seconds: float) -> dict[str, Any]:
    total = summary([s[0] for s in samples])
    return {
        "writes": len(samples),
        "rate": len(samples) / seconds,
        "p50": total["p50"],
        "p99": total["p99"],
        "stmt": summary([s[1] for s in samples])["p50"],
        "gap": summary([s[2] for s in samples])["p50"],
        "commit": summary([s[3] for s in samples])["p50"],
    }


def main() -> None:
    parser = part_parser(__doc__, smoke="1 and 2 writers, 1 s blocks", plots_option=True)
    parser.add_argument("--seconds", type=float, default=10.0, help="per block")
    parser.add_argument("--writers", default="1,2,4,8,16")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--pool-size", type=int, default=8, help="PgBouncer server connections")
    parser.add_argument("--probe", type=int, default=300, help="flush-probe commits per setting")
    args = parse_part_args(parser)
    smoke = args.smoke
    seconds = 1.0 if smoke else args.seconds
    levels = [1, 2] if smoke else [int(n) for n in args.writers.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {list(MODES)}")
    bench_env()
    setup(settings="bench.settings", database=database(smoke))
    url = os.environ["DATABASE_URL"]
    rid = uuid.uuid4().hex[:8]
    base = populate(rid, max(levels))

    results: dict[str, Any] = {"head_before": head_state()}
    for mode in modes:
        print(f"{mode}: {max(levels)} writer processes", flush=True)
        results[mode] = measure_mode(mode, levels, seconds, base, url, args.pool_size)
        if "skipped" in results[mode]:
            print(f"  {mode} SKIPPED: {results[mode]['skipped']}", flush=True)
    results["head_after"] = head_state()
    breakdown = statement_breakdown(base, 5 if smoke else 100)
    probe = flush_probe(url, 20 if smoke else args.probe)
    fsync = {"skipped": "--smoke"} if smoke else pg_test_fsync(url)
    cmd = " ".join([".venv/bin/python bench/write_ceiling.py", *sys.argv[1:]])
    report(cmd, levels, seconds, args.pool_size, results, breakdown, probe, fsync, args.json)


# --- the record -----------------------------------------------------------------------


def report(
    cmd: str,
    levels: list[int],
    seconds: float,
    pool_size: int,
    results: dict[str, Any],
    breakdown: dict[str, Any],
    probe: dict[str, Any],
    fsync: dict[str, Any],
    json_path: str | None,
) -> None:
    head = (results.pop("head_before"), results.pop("head_after"))
    measured = {m: r for m, r in results.items() if "skipped" not in r}
    rows = []
    for mode, r in measured.items():
        for n in levels:
            a, p = r["atlas"][n], r["plain"][n]
            rows.append(
                [
                    MODES[mode],
                    n,
                    a["rate"],
                    a["p50"],
                    a["p99"],
                    p["rate"],
                    p["p50"],
                    p["p99"],
                    f"{a['rate'] / p['rate']:.0%}" if p["rate"] else "–",
                ]
            )
    hold_rows = []
    for mode, r in measured.items():
        for n in levels:
            a = r["atlas"][n]
            hold_rows.append(
                [MODES[mode], n, a["stmt"], a["gap"], a["commit"], r["plain"][n]["commit"]]
            )
    series: dict[str, tuple[list[float], list[float]]] = {}
    for mode, r in measured.items():
        series[f"Atlas, {MODES[mode]}"] = (levels, [r["atlas"][n]["rate"] for n in levels])
    for mode, r in measured.items():
        series[f"plain get()+save(), {MODES[mode]}"] = (
            levels,
            [r["plain"][n]["rate"] for n in levels],
        )
    plot(
        "write_ceiling.png",
        series,
        title="Single-entity writes/s vs concurrent writer processes",
        xlabel="writer processes",
        ylabel="writes/s (all writers)",
        ymin0=True,
    )
    analysis = breakdown_lines(breakdown) + ceiling_analysis(measured, levels, probe, fsync)
    lines = [
        header(cmd),
        "",
        f"Each writer is its own process (its own Django, its own connection) writing"
        f" single-entity changes to its own {KEYS_PER_WRITER} keys (no row contention) for"
        f" {seconds:g} s per block: Atlas through `changeset_apply` (a superuser actor: no"
        " role lookup), then plain `get()`+`save()` of an untracked model, each in its own"
        " transaction; the order alternates by writer count. writes/s = writes finished in"
        " the block, all writers together; latency per write in ms."
        f" PgBouncer: this run's own, `pool_mode = transaction`, {pool_size} server"
        " connections, `ATLAS_DB_POOLING=transaction` in the writers (no prepared"
        " statements). `synchronous_commit=off`: `SET` in each writer's session (plain"
        " too). The machine is shared: these figures are noisy.",
        "",
        table(
            [
                "mode",
                "writers",
                "Atlas writes/s",
                "p50 ms",
                "p99 ms",
                "plain writes/s",
                "p50 ms",
                "p99 ms",
                "Atlas / plain",
            ],
            rows,
        ),
        "",
        image("write_ceiling.png", "writes/s vs writers, per mode, Atlas and plain"),
        "",
        "Where an Atlas write's time goes (p50 ms, client-side): `log statement` = the one"
        " statement that writes the entity row, updates the log head (takes its lock, draws"
        " seq, hashes) and inserts the changeset, revision and journal rows, round trip"
        " included (under contention it includes the wait for the head's lock);"
        " `stmt → COMMIT` = Python between that statement and COMMIT (inside the hold);"
        " `COMMIT` = COMMIT's round trip, WAL flush included. Plain's COMMIT beside it.",
        "",
        table(
            ["mode", "writers", "log statement", "stmt → COMMIT", "COMMIT", "plain COMMIT"],
            hold_rows,
        ),
        "",
        *analysis,
    ]
    lines += ["", *why_lines(measured, levels, breakdown), "", head_lines(*head)]
    skipped = {m: r["skipped"] for m, r in results.items() if "skipped" in r}
    for mode, why in skipped.items():
        lines += ["", f"**{MODES[mode]}: not measured.** {why}."]
    write_section(TITLE, "\n".join(lines))
    out = {
        "head": head,
        "levels": levels,
        "results": results,
        "breakdown": breakdown,
        "probe": probe,
        "fsync": fsync,
    }
    write_json(json_path, out)
    print("\n".join(lines[4:]))


BEFORE_HEAD = ("ei", "eu", "ed")
AFTER_HEAD = ("c", "j", "r", "NOTIFY trigger")


def breakdown_lines(breakdown: dict[str, Any]) -> list[str]:
    """The statement's server-side split, before and after the head's lock."""
    if "skipped" in breakdown:
        return [
            f"Server-side split of the log statement: not measured ({breakdown['skipped']}).",
            "",
        ]
    if not breakdown:
        return ["Server-side split of the log statement: no plans were captured.", ""]
    names = [n for n in (*BEFORE_HEAD, "h", *AFTER_HEAD) if n in breakdown]
    after = sum(breakdown.get(n, 0.0) for n in AFTER_HEAD)
    return [
        "The log statement as the server times it (one writer, `auto_explain` with"
        " analyze, p50 ms per part; per-node timing inflates each a little): entity"
        " rows (`eu` update / `ei` insert) run before the head update `h` takes the lock;"
        " the changeset `c`, journal entry `j` (with its statement-level NOTIFY trigger)"
        " and revision `r` inserts run after it, inside the hold.",
        "",
        table(
            ["statement", *names], [[breakdown.get("statement"), *[breakdown[n] for n in names]]]
        ),
        "",
        f"Inside the hold from the statement: ≈ {after:.3f} ms (c + j + trigger + r).",
        "",
    ]


def ceiling_analysis(
    measured: dict[str, Any], levels: list[int], probe: dict[str, Any], fsync: dict[str, Any]
) -> list[str]:
    """The flush measurements, and the ceiling 1 / hold beside the measured peak."""
    lines = ["The server's cost of a WAL flush on this machine:", ""]
    on, off = probe.get("commit_on"), probe.get("commit_off")
    if on and off:
        lines.append(
            f"- a probe session's COMMIT of a one-row upsert: p50"
            f" {on['p50']:.3f} ms with `synchronous_commit=on`, {off['p50']:.3f} ms with off"
            f" ({on['n']} each): the flush a commit waits for is ≈"
            f" {on['p50'] - off['p50']:.3f} ms."
        )
    notify = probe.get("commit_on_notify")
    if on and notify:
        lines.append(
            f"- the same with a `pg_notify` in the transaction (what the journal trigger adds:"
            f" a cluster-wide lock and a queue entry at commit): p50 {notify['p50']:.3f} ms,"
            f" ≈ {notify['p50'] - on['p50']:+.3f} ms."
        )
    if "sync_ms_per_commit_on" in probe:
        lines.append(
            "- `pg_stat_wal.wal_sync_time` (`track_wal_io_timing` on in that session only):"
            f" {probe['sync_ms_per_commit_on']:.3f} ms of fsync per synchronous commit"
            " (lower when another backend's flush already covered the commit record)."
        )
    elif not probe.get("track_wal_io_timing"):
        lines.append("- `track_wal_io_timing` could not be set (not a superuser).")
    if "usecs" in fsync:
        lines.append(
            f"- `pg_test_fsync` on the data directory's filesystem, one 8 kB write +"
            f" `{fsync['method']}` (the server's `wal_sync_method`): {fsync['usecs']} µs"
            f" ({fsync['ops']:,.0f}/s)."
        )
    else:
        lines.append(f"- `pg_test_fsync`: not run ({fsync.get('skipped', '?')}).")
    lines += ["", "The ceiling, 1 / hold, from the one-writer figures of each mode:", ""]
    rows = []
    for mode, r in measured.items():
        one = r["atlas"][levels[0]]
        upper = one["stmt"] + one["gap"] + one["commit"]
        lower = one["gap"] + one["commit"]
        peak_n = max(levels, key=lambda n: r["atlas"][n]["rate"])
        peak = r["atlas"][peak_n]["rate"]
        rows.append(
            [
                MODES[mode],
                lower,
                upper,
                1000 / upper if upper else float("nan"),
                1000 / lower if lower else float("nan"),
                f"{peak:,.0f} at {peak_n}",
                1000 / peak if peak else float("nan"),
            ]
        )
    lines.append(
        table(
            [
                "mode",
                "hold ≥ ms (stmt→COMMIT + COMMIT)",
                "hold ≤ ms (+ log statement)",
                "ceiling ≥ /s",
                "ceiling ≤ /s",
                "measured peak /s (writers)",
                "ms per write at the peak",
            ],
            rows,
        )
    )
    return lines


def why_lines(measured: dict[str, Any], levels: list[int], breakdown: dict[str, Any]) -> list[str]:
    """Why Atlas flattens where plain does not, the hold's parts in this run, the levers."""
    lines = [
        "**Why it flattens.** Every changeset updates the one log-head row; its lock is held"
        " from that update to the end of COMMIT, and COMMIT waits for the WAL flush, so"
        " changesets commit one at a time and the ceiling is ≈ 1 / hold, whatever the number"
        " of writers. Past it, more writers only queue on the head's lock: the log"
        " statement's time grows with the writers, COMMIT's does not. Plain writes share no"
        " row, so PostgreSQL's group commit lets one flush cover several commits and they"
        " keep scaling until the CPU or the disk runs out (on 2 shared cores the CPU runs"
        " out early: with the flush off, both curves here are CPU-bound).",
    ]
    direct = measured.get("direct")
    if direct:
        one = direct["atlas"][levels[0]]
        after = sum(breakdown.get(n, 0.0) for n in AFTER_HEAD) if "h" in breakdown else None
        hold = (after or 0.0) + one["gap"] + one["commit"]
        parts = [f"COMMIT {one['commit']:.2f} ms (the flush included)"]
        parts.append(f"Python from the statement's end to COMMIT {one['gap']:.3f} ms")
        if after is not None:
            parts.append(f"the statement's rows after the head update {after:.2f} ms")
        if not one["commit"]:
            # The unlocked single write (changesets.services.apply): no COMMIT of its own.
            parts = [
                "the single write's log statement commits as it ends (the unlocked path,"
                " docs/architecture.md), so its COMMIT and the flush are inside the"
                f" statement's {one['stmt']:.2f} ms, and no Python runs while the head is held"
            ]
            if after is not None:
                parts.append(f"the statement's rows after the head update {after:.2f} ms")
        lines += [
            "",
            f"**What is inside the hold** (direct, one writer, p50): {'; '.join(parts)}"
            + (f": COMMIT is {one['commit'] / hold:.0%} of it." if hold and one["commit"] else ".")
            + " Nothing else sits in it: the head update, the changeset, journal and revision"
            " inserts are one statement (no round trip to Python while the lock is held);"
            " the checks deferred to COMMIT are the revision's and journal entry's foreign"
            " keys to the changeset inserted in the same statement and a created entity's"
            " namespace key (an index probe each; kept because PostgreSQL uses foreign keys"
            " to estimate joins); the journal's NOTIFY trigger is"
            " statement-level (its commit-time cost is the `pg_notify` line above). The"
            " Python between the statement and COMMIT (reading the row, the write hooks,"
            " the result objects) is a few hundredths of a millisecond: there is nothing"
            " worth moving out of the hold in code; the flush is the hold.",
        ]
    lines += [
        "",
        "**The levers**, in the order they pay:",
        "",
        "1. `synchronous_commit = off` for Atlas's role or database (`ALTER ROLE atlas SET"
        " synchronous_commit = off`; also works behind a transaction pooler, which passes no"
        " startup options): COMMIT returns before the flush, so the hold loses it. A crash"
        " can lose the last acknowledged commits (up to 3 × `wal_writer_delay`, 600 ms by"
        " default), never their order or atomicity: WAL replays in order, so a lost"
        " changeset takes every later one with it, and seq, the chain and the journal stay"
        " consistent. Only for writes whose callers can redo the last second.",
        "2. Faster WAL: the flush is most of the hold, so the ceiling moves with the WAL"
        " device's fsync latency (NVMe with power-loss protection or a battery-backed"
        " cache: tens of µs instead of milliseconds). `pg_test_fsync`'s figure is the"
        " floor; `commit_delay` does not help (no two head-holding commits are ever"
        " waiting for a flush together).",
        "3. Batching: `POST /api/v1/batch` writes N entity changes as one changeset, one"
        " hold: the ceiling is in changesets per second, not entities per second.",
        "4. A pooler does not raise the ceiling: it saves server connections, not hold. Under"
        " transaction pooling statements are not prepared, so each write pays parse and"
        " plan (before the lock: latency and CPU, not hold).",
    ]
    return lines


def head_lines(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The head row's dead versions before and after the run, and what they cost a read."""
    return (
        "**The head row's dead versions.** Each seq draw leaves a dead version of the one"
        " head row; PostgreSQL prunes them only once no snapshot anywhere in the cluster is"
        " older (a long transaction in any database, a replica's `hot_standby_feedback`, a"
        " replication slot hold them all back), and until then every draw's index scan"
        f" walks past them. This run: {before['dead']:,} dead versions"
        f" ({before['bytes'] / 1024:,.0f} KiB) before, {after['dead']:,}"
        f" ({after['bytes'] / 1024:,.0f} KiB) after; reading the head then touched"
        f" {after['buffers']:,} buffers in {after['read_ms']:.2f} ms (before: "
        f"{before['buffers']:,} in {before['read_ms']:.2f} ms); the cluster's oldest snapshot"
        f" was {after['oldest_xmin_age'] or 0:,} transactions old. Watch"
        " `n_dead_tup` of `changesets_loghead` and long transactions (docs/deploy.md)."
    )


if __name__ == "__main__":
    main()
