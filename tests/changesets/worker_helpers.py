"""Test helpers for the push side: webhook receivers, a real broker, real worker processes.

- :class:`Receiver` is a threaded HTTP server on 127.0.0.1 that records every
  delivery, checks its signature, and can fail, stall or hold requests.
- :func:`real_broker` points this process's Celery app at a real broker
  (``CELERY_BROKER_URL`` when it names Redis or RabbitMQ, else Redis at
  ``redis://127.0.0.1:6379/7``) on a queue of its own, or skips loudly when
  none is reachable.
- :class:`Worker` runs ``celery -A atlas worker`` as a subprocess against the
  test database pytest-django created.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import quote

import pytest
from django.db import connection

from atlas.celery import app as celery_app

BASE_DIR = Path(__file__).resolve().parents[2]
DEFAULT_REDIS = "redis://127.0.0.1:6379/7"
WORKER_START_TIMEOUT = 30.0


# --- receivers ------------------------------------------------------------------------------


@dataclass
class Delivery:
    delivery_id: str
    signature: str
    body: bytes
    document: dict[str, Any]
    status: int = 0
    signature_ok: bool | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.document.get("records", [])


@dataclass
class Receiver:
    """A webhook endpoint. ``respond(n, delivery) -> status`` decides each answer
    (``n`` counts requests from 0); ``hold(n, delivery) -> bool`` parks a request
    until :meth:`release` (``held`` is set while one is parked)."""

    respond: Callable[[int, Delivery], int] = lambda n, d: 200
    hold: Callable[[int, Delivery], bool] = lambda n, d: False
    secret: str | None = None
    delay: float = 0.0
    deliveries: list[Delivery] = field(default_factory=list)
    held: threading.Event = field(default_factory=threading.Event)
    _released: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                receiver._handle(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length)
        delivery = Delivery(
            delivery_id=request.headers.get("X-Atlas-Delivery", ""),
            signature=request.headers.get("X-Atlas-Signature", ""),
            body=body,
            document=json.loads(body or b"{}"),
            headers={k.lower(): v for k, v in request.headers.items()},
        )
        if self.secret is not None:
            expected = "sha256=" + hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
            delivery.signature_ok = hmac.compare_digest(expected, delivery.signature)
        with self._lock:
            n = len(self.deliveries)
            self.deliveries.append(delivery)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hold(n, delivery):
                self.held.set()
                self._released.wait(60)
            if self.delay:
                time.sleep(self.delay)
            delivery.status = self.respond(n, delivery)
            with contextlib.suppress(OSError):
                request.send_response(delivery.status)
                request.send_header("Content-Length", "2")
                request.end_headers()
                request.wfile.write(b"ok")
        finally:
            with self._lock:
                self.in_flight -= 1

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()

    # What a receiver that de-duplicates by event_id ends up holding.
    def accepted(self) -> list[Delivery]:
        return [d for d in self.deliveries if 200 <= d.status < 300]

    def event_ids(self) -> set[str]:
        return {r["event_id"] for d in self.accepted() for r in d.records}


@contextlib.contextmanager
def receiver_factory() -> Iterator[Callable[..., Receiver]]:
    """``with receiver_factory() as make: make(respond=...)``; all close on exit."""
    made: list[Receiver] = []

    def make(**kwargs: Any) -> Receiver:
        receiver = Receiver(**kwargs)
        made.append(receiver)
        return receiver

    try:
        yield make
    finally:
        for receiver in made:
            receiver.close()


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str, every: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


# --- a real broker --------------------------------------------------------------------------


def broker_url() -> str:
    url = os.environ.get("CELERY_BROKER_URL", "")
    return (
        url if url.startswith(("redis://", "rediss://", "amqp://", "pyamqp://")) else DEFAULT_REDIS
    )


def broker_reachable(url: str, timeout: float = 1.0) -> bool:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
        return True
    except Exception:  # noqa: BLE001
        return False


@contextlib.contextmanager
def celery_configured(**conf: Any) -> Iterator[None]:
    """Change this process's Celery configuration for a block, dropping cached
    connections and routing so the change takes effect."""
    saved = {name: celery_app.conf[name] for name in conf}
    # Celery reads the broker URL from the environment before its configuration
    # (``celery.app.utils.Settings.broker_url``): with CELERY_BROKER_URL set, as on
    # a machine whose tests use a real broker, a changed ``broker_url`` alone would
    # not take effect. The variable follows the block's URL.
    env = {"CELERY_BROKER_URL": conf["broker_url"]} if "broker_url" in conf else {}

    def reset() -> None:
        from kombu import pools

        # Close and forget every cached connection and producer pool (kombu keeps
        # them in a global registry keyed by broker; a closed one must not stay there).
        with contextlib.suppress(Exception):
            pools.reset()
        celery_app._pool = None
        celery_app.__dict__.pop("amqp", None)

    try:
        with mock.patch.dict(os.environ, env):
            celery_app.conf.update(conf)
            reset()
            yield
    finally:
        celery_app.conf.update(saved)
        reset()


@dataclass
class Broker:
    url: str
    queue: str

    def process_conf(self) -> dict[str, Any]:
        return {
            "task_always_eager": False,
            "broker_url": self.url,
            "broker_transport_options": {},
            "task_default_queue": self.queue,
        }


@contextlib.contextmanager
def real_broker() -> Iterator[Broker]:
    """A reachable broker and a queue nobody else uses; this process publishes to it.

    Skips the test, loudly, when no broker is reachable.
    """
    url = broker_url()
    if not broker_reachable(url):
        pytest.skip(
            f"REAL-BROKER TEST SKIPPED: no broker reachable at {url} (Redis at "
            f"{DEFAULT_REDIS} not reachable, and CELERY_BROKER_URL names no reachable "
            "redis:// or amqp:// broker). Start Redis to run the crash-safety tests."
        )
    broker = Broker(url=url, queue=f"atlas-test-{uuid.uuid4().hex[:12]}")
    try:
        with celery_configured(**broker.process_conf()):
            yield broker
    finally:
        with contextlib.suppress(Exception):
            from kombu import Connection

            with Connection(url, connect_timeout=1) as conn:
                conn.SimpleQueue(broker.queue).queue(conn.default_channel).delete()


# --- real worker processes ------------------------------------------------------------------


def database_url_for_workers() -> str:
    """A DATABASE_URL for the database this test run uses (pytest-django's test database)."""
    s = connection.settings_dict
    user, password = quote(s.get("USER") or ""), quote(s.get("PASSWORD") or "")
    options = s.get("OPTIONS") or {}
    host = s.get("HOST") or options.get("host") or ""
    port, name = s.get("PORT") or options.get("port") or "", s["NAME"]
    credentials = f"{user}:{password}@" if user else ""
    if host.startswith("/"):
        return f"postgresql://{credentials}/{quote(name)}?host={quote(host, safe='/')}" + (
            f"&port={port}" if port else ""
        )
    return f"postgresql://{credentials}{host}{':' + str(port) if port else ''}/{quote(name)}"


class Worker:
    """``celery -A atlas worker`` (prefork, with embedded beat) on the test database."""

    def __init__(self, broker: Broker, *, beat: bool = True, **env: Any) -> None:
        self.broker = broker
        self.beat = beat
        self.dir = Path(tempfile.mkdtemp(prefix="atlas-worker-"))
        self.log_path = self.dir / "worker.log"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url_for_workers(),
            "CELERY_BROKER_URL": broker.url,
            "CELERY_TASK_DEFAULT_QUEUE": broker.queue,
            "ATLAS_ALLOW_PRIVATE_WEBHOOKS": "1",
            "ATLAS_DB_CONN_MAX_AGE": "0",
            "ATLAS_JOURNAL_SWEEP_AGE_SECONDS": "1",
            "ATLAS_JOURNAL_SWEEP_INTERVAL_SECONDS": "1",
            "ATLAS_SUBSCRIPTION_SWEEP_INTERVAL_SECONDS": "1",
            "ATLAS_WEBHOOK_BACKOFF_BASE_SECONDS": "0.2",
            "ATLAS_WEBHOOK_BACKOFF_MAX_SECONDS": "1",
            "ATLAS_WEBHOOK_TIMEOUT_SECONDS": "5",
            "PYTHONUNBUFFERED": "1",
            **{k: str(v) for k, v in env.items()},
        }
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        argv = [sys.executable, "-m", "celery", "-A", "atlas", "worker", "--loglevel=INFO"]
        argv += ["--concurrency=2", "--pool=prefork", "--without-gossip", "--without-mingle"]
        argv += ["--without-heartbeat", f"--hostname=test-{uuid.uuid4().hex[:8]}@%h"]
        if self.beat:
            argv += ["--beat", "--schedule", str(self.dir / "beat-schedule")]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen(
            argv,
            cwd=BASE_DIR,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_for(self._ready, timeout=WORKER_START_TIMEOUT, what=f"worker ready ({self.log_path})")
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"worker exited ({self.process.returncode}):\n{self.log()}")
        return " ready." in self.log()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the worker and its pool children (its whole process group)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        # Pool children left behind (should not happen) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


@contextlib.contextmanager
def worker_factory(broker: Broker) -> Iterator[Callable[..., Worker]]:
    """``start(**env)`` starts a worker on the test database; all stop on exit."""
    started: list[Worker] = []

    def start(**env: Any) -> Worker:
        worker = Worker(broker, **env)
        started.append(worker)
        return worker.start()

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()
            # Shown by pytest when the test failed.
            print(f"--- worker log {worker.log_path} (tail) ---\n{worker.log()[-6000:]}")
