"""CPU seconds by process group for the HTTP benchmark: web, worker, PostgreSQL, load generator.

Atlas's post-commit work runs in the worker and in PostgreSQL, not in the
request, so a fair comparison with a plain endpoint has to count every
process's CPU, not the requests' time. Snapshots are cumulative; the benchmark
subtracts two of them for an interval (a block and its drain).

The web tier and the worker are process trees the benchmark started: each
process's CPU plus what its reaped children used (``children_*``), so a pool
child that exits mid-block still counts. PostgreSQL is shared with whatever
else runs on the machine, and a session of another job that ends would pour
its whole lifetime's CPU into the postmaster's ``children_*``; so it is
sampled instead (:class:`PostgresCpu`).
"""

from __future__ import annotations

import contextlib
import re
import threading

import psutil

# The groups whose CPU makes up the whole machine's cost of a PUT.
SERVER_GROUPS = ("web", "worker", "postgres")
GROUPS = (*SERVER_GROUPS, "loadgen")
# A backend's title: "postgres: [cluster: ]user database host(port)|[local] state".
BACKEND = re.compile(r"(?:^|\s)(\S+) (\S+) (\[local\]|\S+\(\d+\))")
AUTOVACUUM = re.compile(r"autovacuum worker (\S+)")


def _cpu(process: psutil.Process) -> float:
    """User + system seconds of ``process`` and of the children it has reaped."""
    t = process.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def _sum_cpu(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            total += _cpu(process)
    return total


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _named(*names: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] in names]


def session_database(title: str) -> str | None:
    """The database a server process works for, from its title; None for the
    server's shared processes (checkpointer, WAL writer, launchers …)."""
    backend = BACKEND.search(title)
    if backend:
        return backend.group(2)
    autovacuum = AUTOVACUUM.search(title)
    return autovacuum.group(1) if autovacuum else None


class PostgresCpu:
    """The benchmark's PostgreSQL server: the postmaster, its shared processes and the
    sessions on the benchmark database ("ours"); sessions on other databases ("other",
    other jobs on the machine) apart. A thread samples every process's CPU every
    ``interval`` seconds and keeps the last value of each, so a session that ends
    keeps all but (at most) its last ``interval`` of CPU, and none of it lands twice.
    """

    def __init__(self, postmaster_pid: int, database: str, *, interval: float = 0.25) -> None:
        self.postmaster = psutil.Process(postmaster_pid)
        self.database = database
        self.seen: dict[tuple[int, float], tuple[str, float]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.poll()
        self.thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self.thread.start()

    @classmethod
    def of_django_connection(cls) -> PostgresCpu | None:
        """The server behind Django's connection, if it runs on this machine."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), current_database()")
            pid, database = cursor.fetchone()
        try:
            return cls(psutil.Process(pid).ppid(), database)
        except psutil.Error:
            print("!!! PostgreSQL is not on this machine: its CPU is not counted !!!", flush=True)
            return None

    def _run(self, interval: float) -> None:
        while not self.stop.wait(interval):
            self.poll()

    def poll(self) -> None:
        with self.lock:
            t = self.postmaster.cpu_times()  # its own, not its reaped children's
            key = (self.postmaster.pid, self.postmaster.create_time())
            self.seen[key] = ("ours", t.user + t.system)
            for child in self.postmaster.children():
                try:
                    with child.oneshot():
                        key = (child.pid, child.create_time())
                        title = " ".join(child.cmdline())
                        t = child.cpu_times()
                except psutil.Error:
                    continue
                database = session_database(title)
                kind = "ours" if database in (None, self.database) else "other"
                self.seen[key] = (kind, t.user + t.system)

    def totals(self) -> dict[str, float]:
        self.poll()
        with self.lock:
            out = {"ours": 0.0, "other": 0.0}
            for kind, seconds in self.seen.values():
                out[kind] += seconds
            return out

    def close(self) -> None:
        self.stop.set()


class CpuMeter:
    """Cumulative CPU seconds by group; subtract two snapshots for an interval.

    web = the gunicorn master and its workers; worker = the celery main process
    (consumer, journal relay, beat's parent) and every child (pool, embedded beat);
    postgres = :class:`PostgresCpu`'s "ours"; loadgen = this process (client
    threads, the webhook receiver, the backlog polls, the sampling). Beside
    them, outside the sums: ``redis`` (the broker), ``postgres_other`` (other
    databases' sessions) and ``machine`` (all busy CPU, to show what else ran).
    """

    def __init__(self, web_pid: int, worker_pid: int, postgres: PostgresCpu | None) -> None:
        self.web_pid = web_pid
        self.worker_pid = worker_pid
        self.postgres = postgres
        self.me = psutil.Process()

    def snapshot(self) -> dict[str, float]:
        pg = self.postgres.totals() if self.postgres else {"ours": 0.0, "other": 0.0}
        own = self.me.cpu_times()
        machine = psutil.cpu_times()
        return {
            "web": _sum_cpu(_tree(self.web_pid)),
            "worker": _sum_cpu(_tree(self.worker_pid)),
            "postgres": pg["ours"],
            # Not children_*: this process's children are the web tier and the worker.
            "loadgen": own.user + own.system,
            "redis": _sum_cpu(_named("redis-server")),
            "postgres_other": pg["other"],
            "machine": machine.user + machine.nice + machine.system + machine.irq + machine.softirq,
        }

    def close(self) -> None:
        if self.postgres is not None:
            self.postgres.close()


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}
