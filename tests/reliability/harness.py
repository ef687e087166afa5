"""Shared machinery for the reliability harnesses (docs/reliability.md).

In the test process:

- :func:`sized` picks the bounded (CI) or the full size (``ATLAS_STRESS=1``).
- :func:`gunicorn` runs the real web tier (``gunicorn atlas.wsgi``, ``DEBUG``
  off) as a subprocess against a given database, optionally with fault hooks
  (below), and waits until it answers.
- :class:`Api` is a small HTTP client that only ever talks to 127.0.0.1;
  :func:`load` runs bounded request loops (a count *and* a time limit) in
  threads and collects statuses and latencies.
- :func:`run_writers` starts writer *processes* (this module's ``write``
  mode) and collects what each committed.
- :class:`ThrowawayPostgres` is a PostgreSQL cluster of its own (initdb +
  pg_ctl from the ``pgserver`` wheel) on a free port of 127.0.0.1, for the
  tests that stop and restart the database.
- :func:`record` prints a result line and appends it to
  ``.atlas/reliability/results.jsonl`` (what docs/reliability.md quotes).

As a program (``python -m tests.reliability.harness MODE``), in a child
process with ``DATABASE_URL`` set to the database under test:

- ``serve -- <gunicorn args>``: gunicorn with ``--preload``, after applying the
  hooks named in ``ATLAS_HARNESS_HOOKS`` (``crash_after_commit``: the process
  ``os._exit``s in an ``on_commit`` callback the hook registers, i.e. after
  the commit and before the journal task is published; ``time_seq=<dir>``: log how long drawing
  ``seq`` — waiting for the log head's row lock — took, and how long the lock
  was then held until the commit; ``slow_write=<seconds>``: linger inside
  each write transaction).
- ``write --spec JSON --out FILE``: commit changesets through the write
  service, pausing inside each transaction and rolling some back on purpose.
- ``hold --spec JSON``: one write that stops inside its transaction (before or
  right after drawing ``seq``) until told to commit or roll back.
- ``manage --hook-log FILE -- <manage.py args>``: a management command with
  a ``changeset_committed`` receiver that logs each changeset it sees.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parents[2]
RESULTS = BASE_DIR / ".atlas" / "reliability"
STRESS = os.environ.get("ATLAS_STRESS", "") not in ("", "0")
LOOPBACK = "127.0.0.1"


def sized(ci: Any, full: Any) -> Any:
    """The bounded size normally; the full size with ``ATLAS_STRESS=1``."""
    return full if STRESS else ci


def record(name: str, **figures: Any) -> None:
    """Print a result line and append it to ``.atlas/reliability/results.jsonl``."""
    entry = {
        "test": name,
        "mode": "full" if STRESS else "bounded",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        **figures,
    }
    line = json.dumps(entry, default=str)
    print(f"\nRELIABILITY {line}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / "results.jsonl", "a") as out:
        out.write(line + "\n")


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], Any], *, timeout: float, what: str, every=0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def child_env(database_url: str, **extra: Any) -> dict[str, str]:
    """The environment of a child process that uses ``database_url``."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "atlas.settings",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "WARNING",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def database_url_of_tests() -> str:
    """A libpq URL for the database this test run uses (pytest-django's test database)."""
    from tests.changesets.worker_helpers import database_url_for_workers

    return database_url_for_workers()


# --- post-commit publishing in child processes ----------------------------------------------


@contextlib.contextmanager
def publishing() -> Iterator[dict[str, str]]:
    """Environment for children that commit: where their journal tasks go.

    A real Redis queue of their own when Redis is reachable (the production
    shape: the enqueue after commit is a real network call; the queue is
    deleted afterwards, no worker consumes it), else eager execution in the
    child. Either way nothing lands in the shared ``.atlas/broker`` folder.
    """
    from tests.changesets.worker_helpers import DEFAULT_REDIS, broker_reachable

    if broker_reachable(DEFAULT_REDIS):
        queue = f"atlas-reliability-{uuid.uuid4().hex[:10]}"
        try:
            yield {"CELERY_BROKER_URL": DEFAULT_REDIS, "CELERY_TASK_DEFAULT_QUEUE": queue}
        finally:
            with contextlib.suppress(Exception):
                from kombu import Connection

                with Connection(DEFAULT_REDIS, connect_timeout=1) as conn:
                    conn.SimpleQueue(queue).queue(conn.default_channel).delete()
    else:
        yield {"CELERY_TASK_ALWAYS_EAGER": "1", "CELERY_BROKER_URL": "memory://"}


# --- gunicorn -------------------------------------------------------------------------------


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None


def _stop_group(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # anything it left in its group


@contextlib.contextmanager
def gunicorn(
    database_url: str,
    *,
    workers: int = 2,
    threads: int = 1,
    hooks: str = "",
    timeout: float = 120,
    env: dict[str, Any] | None = None,
    ready_timeout: float = 60,
) -> Iterator[Server]:
    """``gunicorn atlas.wsgi`` (``DEBUG`` off) on a free 127.0.0.1 port; stopped on exit."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="atlas-gunicorn-"))
    log_path = folder / "gunicorn.log"
    argv = [sys.executable, "-m", "tests.reliability.harness", "serve", "--"]
    argv += ["--bind", f"{LOOPBACK}:{port}", "--workers", str(workers), "--preload"]
    if threads > 1:
        # gthread closes an idle keep-alive connection after 2 s by default; tests that
        # connect first and then release their requests together at a barrier wait longer
        # than that on a loaded machine, and their POST met a reset connection.
        argv += ["--threads", str(threads), "--worker-class", "gthread", "--keep-alive", "60"]
    argv += ["--timeout", str(int(timeout)), "--graceful-timeout", "5", "--log-level", "warning"]
    child = child_env(
        database_url,
        DEBUG="0",
        SECRET_KEY="atlas-reliability-harness-secret",
        ALLOWED_HOSTS=LOOPBACK,
        ATLAS_HARNESS_HOOKS=hooks,
        **(env or {}),
    )
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            cwd=BASE_DIR,
            env=child,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(process, port, log_path)

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"gunicorn exited ({process.returncode}):\n{server.log()}")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                return s.recv(16).startswith(b"HTTP/1")
        except OSError:
            return False

    try:
        wait_until(ready, timeout=ready_timeout, what=f"gunicorn ready ({log_path})", every=0.2)
        yield server
    finally:
        _stop_group(process)
        tail = server.log()[-4000:]
        if tail.strip():
            print(f"--- gunicorn log {log_path} (tail) ---\n{tail}")
        shutil.rmtree(folder, ignore_errors=True)


# --- HTTP -------------------------------------------------------------------------------------


class Api:
    """A requests session that only talks to 127.0.0.1 (one per thread)."""

    def __init__(self, base: str, token: str | None = None, timeout: float = 30.0) -> None:
        import requests

        if not base.startswith(f"http://{LOOPBACK}:"):
            raise ValueError(f"the harness only sends traffic to {LOOPBACK}, not {base}")
        self.base = base.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.trust_env = False  # no proxies from the environment
        if token:
            self.session.headers["Authorization"] = f"Token {token}"

    def request(self, method: str, path: str, **kw: Any):
        kw.setdefault("timeout", self.timeout)
        return self.session.request(method, self.base + path, **kw)

    def get(self, path: str, **kw: Any):
        return self.request("GET", path, **kw)

    def put(self, path: str, **kw: Any):
        return self.request("PUT", path, **kw)

    def post(self, path: str, **kw: Any):
        return self.request("POST", path, **kw)

    def close(self) -> None:
        self.session.close()


@dataclass
class LoadResult:
    """What a bounded load loop saw."""

    outcomes: list[Any] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    seconds: float = 0.0
    hung: int = 0


def load(
    step: Callable[[int, int], Any],
    *,
    threads: int,
    max_count: int,
    max_seconds: float,
    join_grace: float = 60.0,
) -> LoadResult:
    """Call ``step(thread, i)`` from ``threads`` threads until ``max_count`` calls in
    all or ``max_seconds`` passed, whichever first. ``step`` returns an outcome
    (kept with its latency) or raises (kept in ``errors``; the loop goes on)."""
    result = LoadResult()
    lock = threading.Lock()
    issued = [0]
    deadline = time.monotonic() + max_seconds

    def run(n: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            with lock:
                if issued[0] >= max_count:
                    return
                issued[0] += 1
            started = time.perf_counter()
            try:
                outcome = step(n, i)
            except BaseException as exc:  # noqa: BLE001 - collected for the test to judge
                with lock:
                    result.errors.append(exc)
            else:
                with lock:
                    result.outcomes.append(outcome)
                    result.latencies.append(time.perf_counter() - started)
            i += 1

    started = time.monotonic()
    pool = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(max(0.0, deadline - time.monotonic()) + join_grace)
    result.hung = sum(t.is_alive() for t in pool)
    result.seconds = time.monotonic() - started
    return result


# --- writer processes -------------------------------------------------------------------------


@dataclass
class WriterRun:
    committed: list[dict[str, Any]]
    rolled_back: list[dict[str, Any]]
    logs: list[str]


def start_writer(database_url: str, spec: dict[str, Any], folder: Path, **env: Any):
    """Start one ``write`` child; returns ``(process, out_path, log_path)``."""
    n = spec["writer"]
    out = folder / f"writer-{n}.jsonl"
    log_path = folder / f"writer-{n}.log"
    argv = [sys.executable, "-m", "tests.reliability.harness", "write"]
    argv += ["--spec", json.dumps(spec), "--out", str(out)]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            cwd=BASE_DIR,
            env=child_env(database_url, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, out, log_path


def collect_writers(started: list[tuple[Any, Path, Path]], *, timeout: float) -> WriterRun:
    """Wait for writer children (bounded), then read what each committed."""
    deadline = time.monotonic() + timeout
    for process, _, _ in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(1.0, deadline - time.monotonic()))
    hung = [p.pid for p, _, _ in started if p.poll() is None]
    for process, _, _ in started:
        _stop_group(process, timeout=2)
    logs = [log.read_text(errors="replace") for _, _, log in started if log.exists()]
    if hung:
        raise AssertionError(f"writer processes {hung} still ran after {timeout}s:\n{logs}")
    failed = [(p.pid, p.returncode) for p, _, _ in started if p.returncode != 0]
    if failed:
        raise AssertionError(f"writer processes failed {failed}:\n" + "\n".join(logs)[-6000:])
    committed: list[dict[str, Any]] = []
    rolled_back: list[dict[str, Any]] = []
    for _, out, _ in started:
        for line in out.read_text().splitlines():
            item = json.loads(line)
            (committed if item["outcome"] == "committed" else rolled_back).append(item)
    return WriterRun(committed, rolled_back, logs)


# --- a throw-away PostgreSQL cluster -----------------------------------------------------------


def _prepare_unprivileged_user(bin_path: Path) -> None:
    """As root, what the embedded server's start does before it runs PostgreSQL: the
    ``pgserver`` user exists and can read and run the wheel's binaries. On a new
    machine whose tests use an outside PostgreSQL (``DATABASE_URL``), no embedded
    start has done it yet."""
    import stat

    from pgserver.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists("pgserver")
    ensure_prefix_permissions(bin_path)
    read, run = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    ensure_folder_permissions(bin_path, read | run)
    ensure_folder_permissions(bin_path.parent / "lib", read)


class ThrowawayPostgres:
    """A PostgreSQL cluster of this test's own, on a free port of 127.0.0.1.

    Uses the binaries of the ``pgserver`` wheel (as the embedded default
    does), run as the ``pgserver`` system user when we are root (PostgreSQL
    refuses to run as root). Never the shared embedded cluster, never the
    machine's port 5432: this one may be stopped and restarted at will.
    """

    def __init__(self) -> None:
        from pgserver._commands import POSTGRES_BIN_PATH

        self.bin = Path(POSTGRES_BIN_PATH)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="atlas-throwaway-pg-"))
        self.data = self.dir / "data"
        self.sockets = self.dir / "sock"
        self.log = self.dir / "postgres.log"
        self.as_root = os.geteuid() == 0

    def _run(self, *argv: str, check: bool = True, timeout: float = 120) -> str:
        cmd = [str(a) for a in argv]
        if self.as_root:
            import shlex

            cmd = ["su", "pgserver", "-s", "/bin/sh", "-c", shlex.join(cmd)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout + done.stderr

    def init(self) -> ThrowawayPostgres:
        self.sockets.mkdir(parents=True)
        if self.as_root:
            _prepare_unprivileged_user(self.bin)
            shutil.chown(self.dir, "pgserver", "pgserver")
            shutil.chown(self.sockets, "pgserver", "pgserver")
        self._run(
            self.bin / "initdb",
            "-D",
            self.data,
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )
        conf = (
            f"\nlisten_addresses = '{LOOPBACK}'\nport = {self.port}\n"
            f"unix_socket_directories = '{self.sockets}'\nfsync = off\n"
            "max_connections = 60\nshared_buffers = 64MB\n"
        )
        with open(self.data / "postgresql.conf", "a") as out:
            out.write(conf)
        return self

    def start(self) -> None:
        self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        status = self._run(self.bin / "pg_ctl", "-D", self.data, "status", check=False)
        return "server is running" in status

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{LOOPBACK}:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        self._run(
            self.bin / "psql",
            "-h",
            LOOPBACK,
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-c",
            f'CREATE DATABASE "{name}"',
        )

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if (self.data / "postmaster.pid").exists():
                self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


class Beat:
    """``celery -A atlas beat`` alone, with the same environment as the test workers."""

    def __init__(self, broker: Any, **env: Any) -> None:
        from tests.changesets.worker_helpers import Worker

        template = Worker(broker, beat=False, **env)
        self.env, self.dir = template.env, template.dir
        self.log_path = self.dir / "beat.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Beat:
        argv = [sys.executable, "-m", "celery", "-A", "atlas", "beat", "--loglevel=INFO"]
        argv += ["--schedule", str(self.dir / f"beat-{uuid.uuid4().hex[:6]}")]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=BASE_DIR,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            _stop_group(self.process)


def manage(database_url: str, *args: str, timeout: float = 300, **env: Any):
    """``manage.py <args>`` in a child on ``database_url``; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=child_env(database_url, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def principal(username: str, *, superuser: bool = False, writer_of: tuple[str, ...] = ()):
    """A user with an API token (and roles); returns ``(user, token_key)``."""
    from atlas.services import api_token_create
    from entities.services import role_grant
    from tests.entities.factories import NamespaceFactory, SuperuserFactory, UserFactory

    user = (SuperuserFactory if superuser else UserFactory)(username=username)
    for name in writer_of:
        role_grant(namespace=NamespaceFactory(name=name), principal=user, role="writer")
    return user, api_token_create(user=user, name="harness")[1]


def latency_summary(latencies: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "p99_ms": round(percentile(latencies, 99) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1) if latencies else float("nan"),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else float("nan"),
    }


# ============================================================================================
# Child-process modes
# ============================================================================================


class InjectedRollback(Exception):
    """Raised inside a write transaction on purpose: it must roll back whole."""


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "atlas.settings")
    import django

    django.setup()


def _apply_server_hooks(spec: str) -> None:
    from changesets.services import apply as services

    for hook in filter(None, (h.strip() for h in spec.split(","))):
        name, _, arg = hook.partition("=")
        if name == "crash_after_commit":
            # Die right after COMMIT returned: the changeset and its journal entry
            # are committed, nothing has been published (the relay publishes, and
            # none runs beside this server), and the client gets no answer.
            from django.db import transaction

            real_write_log = services._write_log

            def crash_after(*args: Any, _real=real_write_log, **kw: Any) -> Any:
                out = _real(*args, **kw)
                transaction.on_commit(lambda: os._exit(17))
                return out

            services._write_log = crash_after
        elif name == "time_seq":
            folder = Path(arg)
            real_log = services._write_log

            def log_line(line: str, folder: Path = folder) -> None:
                with open(folder / f"seq-{os.getpid()}.txt", "a") as log:
                    log.write(line + "\n")

            def timed_log(*args: Any, _real=real_log, **kw: Any) -> Any:
                from django.db import transaction

                # The log statement takes the head's lock, draws seq and writes the log:
                # "wait" is that statement (mostly the wait for the lock).
                started = time.perf_counter()
                out = _real(*args, **kw)
                drawn = time.perf_counter()
                log_line(f"wait {drawn - started:.6f}")
                # Held from here to the end of COMMIT: on_commit runs right after it.
                transaction.on_commit(lambda: log_line(f"hold {time.perf_counter() - drawn:.6f}"))
                return out

            services._write_log = timed_log
        elif name == "slow_write":
            # Linger inside the write transaction (entity rows locked, no seq yet).
            from entities.store import BaselineStore

            real_lock = BaselineStore.lock

            def slow_lock(self: Any, *a: Any, _real=real_lock, _pause=float(arg), **kw: Any) -> Any:
                out = _real(self, *a, **kw)
                time.sleep(_pause)
                return out

            BaselineStore.lock = slow_lock
        else:
            raise SystemExit(f"unknown hook {name!r}")


def _serve(argv: list[str]) -> None:
    _setup_django()
    _apply_server_hooks(os.environ.get("ATLAS_HARNESS_HOOKS", ""))
    from gunicorn.app.wsgiapp import WSGIApplication

    sys.argv = ["gunicorn", *argv, "atlas.wsgi:application"]
    WSGIApplication("%(prog)s [OPTIONS] [APP_MODULE]").run()


def _write(spec: dict[str, Any], out_path: Path) -> None:
    """Commit ``count`` changesets, pausing inside each transaction (``pause_ms``, a
    fraction ``after_seq_fraction`` of them right after drawing seq) and rolling back
    a fraction ``rollback`` after drawing seq; see ``tests/reliability/test_ordering.py``."""
    _setup_django()
    from django.contrib.auth import get_user_model
    from django.db import connection

    from changesets.models import Rpc
    from changesets.ops import DeleteOp, PutOp
    from changesets.services import apply as services
    from entities.store import BaselineStore, EntityKey, baseline

    # Its pauses and rollbacks act between the log statement and COMMIT: the locked
    # path (an unlocked write commits in its log statement).
    services._may_write_unlocked = lambda *args: False
    rng = random.Random(spec.get("seed"))
    actor = get_user_model().objects.get(username=spec["actor"])
    ns, kind = spec["namespace"], spec.get("kind", "item")
    pool: list[str] = spec.get("keys") or []
    pause_lo, pause_hi = (x / 1000 for x in spec.get("pause_ms", (0, 0)))
    plan: dict[str, Any] = {}

    real_lock = BaselineStore.lock
    real_log = services._write_log

    def lock(self: Any, *a: Any, **kw: Any) -> Any:  # entity rows locked; no seq yet
        out = real_lock(self, *a, **kw)
        if plan.get("where") == "before" and plan.get("pause"):
            time.sleep(plan["pause"])
        return out

    # The log statement wrote the rows and drew seq: this transaction holds the
    # log head's lock until it commits or rolls back.
    def write_log(changeset: Any, *a: Any, **kw: Any) -> Any:
        out = real_log(changeset, *a, **kw)
        plan["seq"] = changeset.seq
        if plan.get("where") == "after" and plan.get("pause"):
            time.sleep(plan["pause"])
        if plan.get("rollback"):
            raise InjectedRollback(changeset.seq)
        return out

    BaselineStore.lock = lock
    services._write_log = write_log
    deadline = time.monotonic() + spec.get("max_seconds", 600)
    with open(out_path, "a") as out:
        committed = 0
        # ``count`` committed changesets; rolled-back attempts and no-ops come on top
        # (bounded: at most twice as many attempts).
        for i in range(2 * spec["count"]):
            if committed >= spec["count"] or time.monotonic() > deadline:
                break
            plan.clear()
            plan["pause"] = rng.uniform(pause_lo, pause_hi)
            plan["where"] = (
                "after" if rng.random() < spec.get("after_seq_fraction", 0) else "before"
            )
            plan["rollback"] = rng.random() < spec.get("rollback", 0)
            if pool:
                slugs = rng.sample(pool, rng.randint(1, min(spec.get("width_max", 1), len(pool))))
            else:
                slugs = [f"w{spec['writer']}-{i}"]
            ops: list[Any] = []
            for j, slug in enumerate(sorted(slugs)):
                key = EntityKey(ns, kind, slug)
                if rng.random() < spec.get("delete", 0):
                    ops.append(DeleteOp(key, missing_ok=True))
                else:
                    ops.append(PutOp(key, {"w": spec["writer"], "i": i, "j": j}))
            started = time.perf_counter()
            try:
                result = services.changeset_apply(
                    store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE
                )
            except InjectedRollback as exc:
                item = {"outcome": "rolled_back", "seq_drawn": exc.args[0], "i": i}
            else:
                cs = result.changeset
                if cs is None:
                    continue  # e.g. only deletes of absent keys: no changeset (invariant 3)
                item = {
                    "outcome": "committed",
                    "id": str(cs.id),
                    "seq": cs.seq,
                    "op_count": cs.op_count,
                    "versions": {
                        f"{r.namespace}/{r.kind}/{r.slug}": r.after_version
                        for r in result.revisions
                    },
                    "seconds": time.perf_counter() - started,
                    "i": i,
                }
                committed += 1
            out.write(json.dumps(item) + "\n")
            out.flush()
    connection.close()


def _hold(spec: dict[str, Any]) -> None:
    """One write that stops inside its transaction until ``<control>/release`` says what to do.

    ``where``: ``before_seq`` (entity rows locked, nothing written, no seq drawn yet) or
    ``after_seq`` (seq drawn: holding the log head's row lock). Writes
    ``<control>/held`` (with the seq when drawn) once stopped, and
    ``<control>/done`` with the outcome at the end.
    """
    _setup_django()
    from django.contrib.auth import get_user_model

    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services import apply as services
    from entities.store import BaselineStore, EntityKey, baseline

    # It stops between drawing seq and COMMIT: the locked path, which has that moment.
    services._may_write_unlocked = lambda *args: False
    control = Path(spec["control"])
    actor = get_user_model().objects.get(username=spec["actor"])
    key = EntityKey(*spec["key"].split("/"))
    max_hold = spec.get("max_hold", 120)

    def stop_here(seq: int | None) -> None:
        (control / "held").write_text(json.dumps({"seq": seq, "at": time.time()}))
        release = control / "release"
        deadline = time.monotonic() + max_hold
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not release.exists() or release.read_text().strip() == "rollback":
            raise InjectedRollback(seq)

    if spec["where"] == "before_seq":
        real_lock = BaselineStore.lock

        def lock(self: Any, *a: Any, **kw: Any) -> Any:
            out = real_lock(self, *a, **kw)
            stop_here(None)
            return out

        BaselineStore.lock = lock
    else:
        real_log = services._write_log

        def write_log(changeset: Any, *a: Any, **kw: Any) -> Any:
            out = real_log(changeset, *a, **kw)
            stop_here(changeset.seq)
            return out

        services._write_log = write_log
    try:
        result = services.changeset_apply(
            store=baseline, actor=actor, ops=[PutOp(key, {"held": True})], rpc=Rpc.PUT_ENTITY
        )
    except InjectedRollback:
        outcome = {"outcome": "rolled_back", "at": time.time()}
    else:
        cs = result.changeset
        outcome = {"outcome": "committed", "id": str(cs.id), "seq": cs.seq, "at": time.time()}
    (control / "done").write_text(json.dumps(outcome))


def _manage(hook_log: Path, hook_sleep: float, argv: list[str]) -> None:
    _setup_django()
    from django.core.management import execute_from_command_line
    from django.dispatch import receiver

    from changesets.signals import changeset_committed

    @receiver(changeset_committed, dispatch_uid="reliability-hook-log", weak=False)
    def log_hook(sender: Any, changeset: Any, **kwargs: Any) -> None:
        if hook_sleep:
            time.sleep(hook_sleep)
        with open(hook_log, "a") as out:  # O_APPEND: one short line is one write
            out.write(f"{os.getpid()} {changeset.id}\n")

    execute_from_command_line(["manage.py", *argv])


def main(argv: list[str]) -> None:
    import argparse

    if len(argv) > 1 and argv[1] == "serve":
        rest = argv[2:]
        _serve(rest[1:] if rest[:1] == ["--"] else rest)
        return
    parser = argparse.ArgumentParser(prog="harness")
    parser.add_argument("mode", choices=["write", "hold", "manage"])
    parser.add_argument("--spec", default="{}")
    parser.add_argument("--out")
    parser.add_argument("--hook-log")
    parser.add_argument("--hook-sleep", type=float, default=0.0)
    args, rest = parser.parse_known_args(argv[1:])
    spec = json.loads(args.spec)
    if args.mode == "write":
        _write(spec, Path(args.out))
    elif args.mode == "hold":
        _hold(spec)
    else:
        _manage(Path(args.hook_log), args.hook_sleep, rest[1:] if rest[:1] == ["--"] else rest)


if __name__ == "__main__":
    main(sys.argv)
