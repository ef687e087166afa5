"""Atlas as production runs it, for the HTTP benchmark: the processes, the broker, their CPU.

The web tier and the worker are started from ``atlas.devrun.commands`` (what
``make run`` starts: gunicorn with atlas/deploy/gunicorn.conf.py and 2 workers,
``celery -A atlas worker -B`` with its default concurrency and the journal relay
in its main process), so the benchmark cannot drift from the deployed shape. Only
the environment differs: the benchmark's settings and database, a broker queue of
this run, beat's schedule file in a temporary folder.

CPU is counted per process group (bench/_cpu.py), because the post-commit work
runs outside the request (in the worker and its relay) and a benchmark that
only timed requests would not see it.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _common import stop_process_group
from _cpu import CpuMeter, PostgresCpu
from _setup import ROOT

REDIS_URL = "redis://127.0.0.1:6379/9"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_reachable(url: str = REDIS_URL) -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001 - any failure means: not usable
        return False


@dataclass
class Broker:
    """Where the worker's tasks go: Redis db 9 with a queue of this run, else the filesystem."""

    url: str
    queue: str
    redis: bool

    def describe(self) -> str:
        if self.redis:
            return f"Redis 127.0.0.1:6379/9, queue `{self.queue}` (this run's, deleted after)"
        return (
            f"**the filesystem broker** (`filesystem://`, as `make run` without Redis), queue"
            f" `{self.queue}`: Redis at 127.0.0.1:6379 was unreachable"
        )

    def delete_queue(self) -> None:
        """Leave nothing of this run in the broker (the queue name is unique to the run)."""
        with contextlib.suppress(Exception):
            if self.redis:
                import redis

                client = redis.Redis.from_url(self.url)
                keys = [*client.scan_iter(match=f"{self.queue}*"), f"_kombu.binding.{self.queue}"]
                client.delete(*keys)
            else:
                for path in (ROOT / ".atlas" / "broker" / "queue").glob(f"*.{self.queue}.msg"):
                    path.unlink(missing_ok=True)


def choose_broker(rid: str) -> Broker:
    queue = f"atlas-bench-http-{rid}"
    if redis_reachable():
        return Broker(REDIS_URL, queue, True)
    print(
        "\n!!! Redis at 127.0.0.1:6379 is unreachable: the worker uses the FILESYSTEM broker"
        " (as `make run` does without Redis); not the production broker !!!\n",
        flush=True,
    )
    return Broker("filesystem://", queue, False)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when this benchmark dies, even by SIGKILL
    (bench/run_all.py kills a part that overruns its time limit), so no gunicorn or
    worker outlives the run. Linux only; elsewhere the ``finally`` has to do."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``argv`` in a session (process group) of its own, stdout and stderr to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # called before any thread of ours starts
        )


class Stack:
    """gunicorn + the Celery worker, from ``atlas.devrun.commands``; a context manager
    that always stops both process groups and deletes the broker queue."""

    def __init__(
        self,
        broker: Broker,
        *,
        extra_env: dict[str, str] | None = None,
        settings: str = "bench.settings",
        worker: bool = True,
    ) -> None:
        """``settings``: the web tier's and the worker's settings module; ``worker=False``
        starts gunicorn alone (a read benchmark, which enqueues nothing)."""
        from atlas.devrun import commands

        self.broker = broker
        self.with_worker = worker
        self.dir = Path(tempfile.mkdtemp(prefix="atlas-bench-http-"))
        self.port = free_port()
        saved = os.environ.get("ATLAS_STATE_DIR")
        os.environ["ATLAS_STATE_DIR"] = str(self.dir)  # beat's schedule file goes here
        try:
            self.commands = commands("127.0.0.1", str(self.port))
        finally:
            if saved is None:
                os.environ.pop("ATLAS_STATE_DIR", None)
            else:
                os.environ["ATLAS_STATE_DIR"] = saved
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings,
            "CELERY_BROKER_URL": broker.url,
            "CELERY_TASK_DEFAULT_QUEUE": broker.queue,
            "ATLAS_ALLOW_PRIVATE_WEBHOOKS": "1",
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),
        }
        self.web_log = self.dir / "web.log"  # gunicorn's access log ("-") lands here
        self.worker_log = self.dir / "worker.log"
        self.web: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Stack:
        print(f"web and worker logs: {self.dir}", flush=True)
        try:
            self.web = spawn(self.commands["web"], self.env, self.web_log)
            if self.with_worker:
                self.worker = spawn(self.commands["worker"], self.env, self.worker_log)
            self._wait_web()
            if self.with_worker:
                self._wait_worker()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self.web is not None:
                stop_process_group(self.web, grace=20)
        finally:
            try:
                if self.worker is not None:
                    stop_process_group(self.worker, grace=30)
            finally:
                self.broker.delete_queue()

    def _wait_web(self) -> None:
        assert self.web is not None
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    return
            if self.web.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start:\n{tail(self.web_log)}")
            time.sleep(0.2)

    def _wait_worker(self) -> None:
        """Until Celery says ready; and it must consume this run's queue."""
        assert self.worker is not None
        deadline = time.monotonic() + 90
        while " ready." not in self.worker_log.read_text(errors="replace"):
            if self.worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the celery worker did not start:\n{tail(self.worker_log)}")
            time.sleep(0.2)
        if f".> {self.broker.queue} " not in self.worker_log.read_text(errors="replace"):
            raise RuntimeError(
                f"the worker does not consume queue {self.broker.queue}:\n{tail(self.worker_log)}"
            )

    def meter(self) -> CpuMeter:
        """CPU of this stack's processes, of PostgreSQL (Django's connection's server)
        and of this process."""
        assert self.web is not None and self.worker is not None
        return CpuMeter(self.web.pid, self.worker.pid, PostgresCpu.of_django_connection())

    def concurrency(self) -> str:
        """The pool as the worker's banner states it, e.g. ``2 (prefork)``."""
        for line in self.worker_log.read_text(errors="replace").splitlines():
            if "concurrency:" in line:
                return line.split("concurrency:", 1)[1].strip()
        return "?"

    def shown(self, name: str) -> str:
        """A command line as the doc shows it: ``python`` for the interpreter, no temp paths."""
        words = ["python" if w == sys.executable else w for w in self.commands[name]]
        return " ".join(w.replace(str(self.dir), "<tmp>") for w in words)


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


class Receiver:
    """The subscription's webhook endpoint, in this process: 204 to every POST, counted."""

    def __init__(self) -> None:
        self.posts = 0
        self.bytes = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                size = len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with receiver.lock:
                    receiver.posts += 1
                    receiver.bytes += size
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
