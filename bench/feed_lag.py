"""The change feed: server time of a 1,000-record page, and commit-to-receipt lag.

    .venv/bin/python bench/feed_lag.py [--smoke] [--json PATH]

1. ``feed_page(limit=1000)`` in-process (reading and shaping the records), and
   ``GET /api/v1/changes?limit=1000`` through the in-process client (rendering
   included), from random positions in the log.
2. End-to-end lag: a real ``celery worker`` (prefork, 2 processes) on Redis at
   127.0.0.1:6379 db 9 with a queue of its own (or, when Redis is unreachable,
   the filesystem broker), a subscription whose URL is a receiver on 127.0.0.1,
   and single-entity writes through the service, paced (20/s) and then in a
   burst. Lag = receipt at the receiver − return of the committing
   ``changeset_apply`` (same clock), per changeset; p50/p99.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _common import (
    bench_env,
    clear_journal_backlog,
    database,
    header,
    parse_part_args,
    part_parser,
    stop_process_group,
    summary,
    table,
    write_json,
)
from _setup import ROOT, setup, write_section

REDIS_URL = "redis://127.0.0.1:6379/9"


def redis_reachable(url: str) -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001
        return False


class Receiver:
    """A webhook receiver on 127.0.0.1 recording when each changeset first arrives."""

    def __init__(self) -> None:
        self.first_seen: dict[str, float] = {}
        self.requests = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                now = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.requests += 1
                    for record in json.loads(body or b"{}").get("records", []):
                        receiver.first_seen.setdefault(record["changeset_id"], now)
                self.send_response(200)
                self.send_header("Content-Length", "0")
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


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "celery", "-A", "atlas", "worker", "--loglevel=INFO"]
    argv += ["--concurrency=2", "--pool=prefork", "--without-gossip", "--without-mingle"]
    argv += ["--without-heartbeat", f"--hostname=bench-{uuid.uuid4().hex[:8]}@%h"]
    with open(log, "ab") as out:
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 60
    while " ready." not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process_group(process)
            raise RuntimeError(f"celery worker did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return process


def main() -> None:
    parser = part_parser(__doc__, doc_option=False)
    parser.add_argument("--no-worker", action="store_true", help="page timings only")
    args = parse_part_args(parser)
    smoke = args.smoke
    bench_env()
    rid = uuid.uuid4().hex[:8]
    queue = f"atlas-bench-{rid}"
    use_redis = redis_reachable(REDIS_URL)
    broker = REDIS_URL if use_redis else "filesystem://"
    # This process publishes the journal tasks the worker runs: to the real broker.
    os.environ["CELERY_BROKER_URL"] = broker
    os.environ["CELERY_TASK_DEFAULT_QUEUE"] = queue
    setup(settings="bench.settings", database=database(smoke))

    from django.db import connection
    from rest_framework.test import APIClient

    from changesets.models import Revision, Rpc, Subscription
    from changesets.ops import PutOp
    from changesets.outbox.subscriptions import subscription_create
    from changesets.selectors.feed import cursor_encode, feed_page
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.store import EntityKey, baseline
    from tests.entities.factories import SuperuserFactory

    root = SuperuserFactory(username="bench-root")
    page = 100 if smoke else 1000
    repeat = 3 if smoke else 20

    # --- 1. page time ----------------------------------------------------------------------
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(seq), max(seq), count(*) FROM changesets_revision WHERE branch = ''"
        )
        low, high, count = cursor.fetchone()
    if not count or count < page * 3:
        ns = Namespace.objects.create(name=f"bench.fp{rid}")
        for start in range(0, page * 3, 500):
            ops = [
                PutOp(EntityKey(ns.name, "item", f"k{i}"), {"n": i})
                for i in range(start, start + 500)
            ]
            changeset_apply(store=baseline, actor=root, ops=ops, rpc=Rpc.BATCH_MUTATE)
        with connection.cursor() as cursor:
            cursor.execute("SELECT min(seq), max(seq), count(*) FROM changesets_revision")
            low, high, count = cursor.fetchone()
    rng = random.Random(7)
    # Positions with at least a page of records after them.
    cut = (
        Revision.objects.filter(branch="").order_by("-seq").values_list("seq", flat=True)[page * 2]
    )
    positions = [rng.randrange(low - 1, cut) for _ in range(repeat + 1)]
    sizes = []

    def one_page(after: int) -> None:
        result = feed_page(after_seq=after, namespaces=None, limit=page)
        sizes.append(len(result.records))

    samples_page = []
    one_page(positions[0])
    for after in positions[1:]:
        start = time.perf_counter()
        one_page(after)
        samples_page.append((time.perf_counter() - start) * 1000)
    client = APIClient()
    client.force_authenticate(root)
    samples_http = []
    client.get(f"/api/v1/changes?limit={page}&since={cursor_encode(positions[0])}")
    for after in positions[1:]:
        start = time.perf_counter()
        response = client.get(f"/api/v1/changes?limit={page}&since={cursor_encode(after)}")
        samples_http.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, response.content[:300]
    body_bytes = len(response.content)
    page_result = {
        "selector": summary(samples_page),
        "http": summary(samples_http),
        "records": statistics_median(sizes),
        "bytes": body_bytes,
        "log_revisions": count,
    }

    # --- 2. lag with a worker --------------------------------------------------------------
    lag: dict[str, Any] = {}
    if not args.no_worker:
        Subscription.objects.filter(active=True).update(active=False)  # earlier runs' ones
        ns = Namespace.objects.create(name=f"bench.lag{rid}")
        receiver = Receiver()
        subscription = subscription_create(
            actor=root, name=f"bench {rid}", url=receiver.url, namespaces=[ns.name], start="now"
        )
        log = Path(tempfile.mkdtemp(prefix="atlas-bench-worker-")) / "worker.log"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "atlas.settings",
            "CELERY_BROKER_URL": broker,
            "CELERY_TASK_DEFAULT_QUEUE": queue,
            "ATLAS_ALLOW_PRIVATE_WEBHOOKS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        # The worker's journal relay (changesets/outbox/relay.py) enqueues each commit's journal
        # work; it starts with this part's entries, not the other parts' backlog.
        clear_journal_backlog()
        worker = start_worker(env, log)
        try:
            for mode, count_, gap in (("paced, 20 writes/s", 200, 0.05), ("burst", 200, 0.0)):
                if smoke:
                    count_ = 10
                committed: dict[str, float] = {}
                deadline = time.monotonic() + 60
                for i in range(count_):
                    result = changeset_apply(
                        store=baseline,
                        actor=root,
                        ops=[PutOp(EntityKey(ns.name, "item", f"k{i % 20}"), {"n": i, "m": mode})],
                        rpc=Rpc.PUT_ENTITY,
                    )
                    committed[str(result.changeset.id)] = time.time()
                    if gap:
                        time.sleep(gap)
                    if time.monotonic() > deadline:
                        break
                wait_until = time.monotonic() + 60
                while time.monotonic() < wait_until:
                    with receiver.lock:
                        if all(c in receiver.first_seen for c in committed):
                            break
                    time.sleep(0.05)
                with receiver.lock:
                    lags = [
                        (receiver.first_seen[c] - t) * 1000
                        for c, t in committed.items()
                        if c in receiver.first_seen
                    ]
                lag[mode] = {
                    **summary(lags),
                    "written": len(committed),
                    "received": len(lags),
                    "requests": receiver.requests,
                }
                receiver.requests = 0
        finally:
            stop_process_group(worker)
            receiver.close()
            Subscription.objects.filter(pk=subscription.pk).update(active=False)
            if use_redis:
                with contextlib.suppress(Exception):
                    import redis

                    redis.Redis.from_url(REDIS_URL).delete(queue)

    cmd = ".venv/bin/python bench/feed_lag.py" + (" --smoke" if smoke else "")
    lines = [
        header(cmd),
        "",
        f"A page of {page} records after a random position in a log of {count:,} revisions,"
        f" {repeat} positions:",
        "",
        table(
            ["feed page", "p50 ms", "p95 ms", "records", "response bytes"],
            [
                [
                    "`feed_page()` in-process",
                    page_result["selector"]["p50"],
                    page_result["selector"]["p95"],
                    page_result["records"],
                    "–",
                ],
                [
                    "`GET /api/v1/changes` (in-process client)",
                    page_result["http"]["p50"],
                    page_result["http"]["p95"],
                    page_result["records"],
                    f"{body_bytes:,}",
                ],
            ],
        ),
    ]
    if lag:
        lines += [
            "",
            "Commit-to-receipt lag through a real worker (`celery worker --concurrency=2`,"
            f" broker {'Redis 127.0.0.1:6379/9' if use_redis else 'filesystem'}), a"
            " subscription to a receiver on 127.0.0.1, single-entity writes through the"
            " service (the worker's journal relay, woken by NOTIFY at commit, waits 10 ms"
            " after a quiet spell and until 50 ms after its last pass while commits stream"
            " in (`ATLAS_JOURNAL_RELAY_LINGER_MS`, `ATLAS_JOURNAL_RELAY_STREAM_LINGER_MS`),"
            " publishes the batch and wakes the subscription's pump → pump task → signed"
            " POST):",
            "",
            table(
                ["writes", "p50 ms", "p95 ms", "p99 ms", "max ms", "received", "POSTs"],
                [
                    [
                        mode,
                        v["p50"],
                        v["p95"],
                        v["p99"],
                        v["max"],
                        f"{v['received']}/{v['written']}",
                        v["requests"],
                    ]
                    for mode, v in lag.items()
                ],
            ),
        ]
    write_section("Against the peers 5. Change feed", "\n".join(lines))
    write_json(args.json, {"page": page_result, "lag": lag, "broker": broker})
    print(json.dumps({"page": page_result, "lag": lag}, indent=1, default=str))


def statistics_median(values: list[int]) -> float:
    import statistics

    return statistics.median(values) if values else 0


if __name__ == "__main__":
    main()
