"""HTTP PUT throughput and latency against gunicorn: Atlas vs a plain DRF update endpoint.

    .venv/bin/python bench/http_throughput.py [--smoke] [--seconds 8] [--workers 4]

One gunicorn (sync workers, ``bench.settings``: Atlas's URLs plus
``PUT /bench/plain/<namespace>/<slug>``, a plain ``UpdateAPIView`` over an
untracked model) on 127.0.0.1. 1, 4 and 8 client threads each PUT new content
to keys of their own, for a fixed time per (endpoint, clients), in two passes
with the endpoint order swapped; throughput = successful PUTs / second, p50/p99
latency. Both endpoints authenticate the same DRF token of a non-staff user
(a writer in the Atlas namespace). Post-commit journal tasks are enqueued by
``manage.py journal_relay`` (``changesets/outbox/relay.py``), run beside gunicorn on
the same cores as a deployment's workers run it, to Redis (127.0.0.1:6379 db
9, a queue of this run, deleted after) when reachable, as in production; else
to an in-memory broker. Target: Atlas ≥ 70% of plain.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from _common import (
    bench_env,
    clear_journal_backlog,
    database,
    header,
    image,
    plot,
    stop_process_group,
    summary,
    table,
    write_json,
)
from _setup import ROOT, setup, write_section

REDIS_URL = "redis://127.0.0.1:6379/9"
KEYS_PER_CLIENT = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_reachable() -> bool:
    try:
        import redis

        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001
        return False


def request(port: int, path: str, body: bytes, token: str) -> tuple[int, float]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "PUT",
            path,
            body=body,
            headers={"Content-Type": "application/json", "Authorization": f"Token {token}"},
        )
        response = conn.getresponse()
        response.read()
        return response.status, (time.perf_counter() - start) * 1000
    finally:
        conn.close()


def load(port: int, token: str, paths: list[list[str]], seconds: float) -> dict:
    """``len(paths)`` client threads, each cycling its own paths, for ``seconds``."""
    latencies: list[float] = []
    errors: list[int] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    payload = "y" * 100

    def client(mine: list[str], seed: int) -> None:
        n = 0
        local: list[float] = []
        bad: list[int] = []
        while time.monotonic() < stop_at and n < 1_000_000:
            body = json.dumps({"content": {"n": seed * 1_000_000 + n, "payload": payload}})
            status, ms = request(port, mine[n % len(mine)], body.encode(), token)
            (local if status == 200 else bad).append(ms if status == 200 else status)
            n += 1
        with lock:
            latencies.extend(local)
            errors.extend(bad)

    started = time.monotonic()
    threads = [
        threading.Thread(target=client, args=(mine, i + int(time.time() * 1000) % 100_000))
        for i, mine in enumerate(paths)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    elapsed = time.monotonic() - started
    return {"latencies": latencies, "errors": errors, "elapsed": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--seconds", type=float, default=8.0, help="per endpoint, clients, pass")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    parser.add_argument("--clients", default="1,4,8")
    args = parser.parse_args()
    smoke = args.smoke
    seconds = 1.0 if smoke else args.seconds
    levels = [1, 2] if smoke else [int(c) for c in args.clients.split(",")]
    bench_env()
    setup(settings="bench.settings", database=database(smoke))

    from atlas.services import api_token_create
    from bench.plain.models import PlainItem
    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.services import role_grant
    from entities.store import EntityKey, baseline
    from tests.entities.factories import SuperuserFactory, UserFactory

    rid = uuid.uuid4().hex[:8]
    root = SuperuserFactory(username="bench-root")
    writer = UserFactory(username="bench-http-writer")
    token = api_token_create(user=writer, name="bench")[1]
    ns = Namespace.objects.create(name=f"bench.http{rid}")
    role_grant(namespace=ns, principal=writer, role="writer")
    slugs = [f"c{c}-k{k}" for c in range(max(levels)) for k in range(KEYS_PER_CLIENT)]
    changeset_apply(
        store=baseline,
        actor=root,
        ops=[PutOp(EntityKey(ns.name, "item", s), {"n": 0}) for s in slugs],
        rpc=Rpc.BATCH_MUTATE,
    )
    plain_ns = f"http-{rid}"
    PlainItem.objects.bulk_create(
        [PlainItem(namespace=plain_ns, slug=s, content={"n": 0}) for s in slugs]
    )

    def paths(impl: str, clients: int) -> list[list[str]]:
        prefix = (
            f"/api/v1/entities/{ns.name}/item/" if impl == "atlas" else f"/bench/plain/{plain_ns}/"
        )
        return [[prefix + f"c{c}-k{k}" for k in range(KEYS_PER_CLIENT)] for c in range(clients)]

    use_redis = redis_reachable()
    queue = f"atlas-bench-http-{rid}"
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "CELERY_BROKER_URL": REDIS_URL if use_redis else "memory://",
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "PYTHONUNBUFFERED": "1",
    }
    log = Path(tempfile.mkdtemp(prefix="atlas-bench-gunicorn-")) / "gunicorn.log"
    argv = [sys.executable, "-m", "gunicorn", "atlas.wsgi", "--bind", f"127.0.0.1:{port}"]
    argv += ["--workers", str(args.workers), "--worker-class", "sync", "--backlog", "256"]
    argv += ["--timeout", "60", "--error-logfile", "-", "--log-level", "warning"]
    with open(log, "ab") as out:
        server = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    clear_journal_backlog()  # no worker runs here: earlier runs' entries wait forever
    # The journal relay (changesets/outbox/relay.py) enqueues the Atlas writes' journal work,
    # as the workers' built-in relay does in a deployment; it runs on the same 2 cores
    # so its CPU counts against Atlas's throughput.
    relay_log = log.with_name("relay.log")
    with open(relay_log, "ab") as out:
        relay = subprocess.Popen(
            [sys.executable, "manage.py", "journal_relay", "--report-seconds", "0"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    results: dict[str, dict[int, dict]] = {"plain": {}, "atlas": {}}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        # Warm every worker (imports, connections, first queries) on both endpoints.
        load(port, token, paths("plain", 4), 1.0)
        load(port, token, paths("atlas", 4), 1.0)
        for clients in levels:
            runs: dict[str, list[dict]] = {"plain": [], "atlas": []}
            for order in (("plain", "atlas"), ("atlas", "plain")):
                for impl in order:
                    runs[impl].append(load(port, token, paths(impl, clients), seconds))
            for impl, parts in runs.items():
                lat = [x for p in parts for x in p["latencies"]]
                errors = [x for p in parts for x in p["errors"]]
                elapsed = sum(p["elapsed"] for p in parts)
                results[impl][clients] = {
                    **summary(lat),
                    "throughput": len(lat) / elapsed,
                    "errors": len(errors),
                    "error_statuses": sorted(set(errors))[:5],
                    "requests": len(lat),
                }
            print(
                f"{clients} clients: plain {results['plain'][clients]['throughput']:.0f}/s,"
                f" atlas {results['atlas'][clients]['throughput']:.0f}/s",
                flush=True,
            )
    finally:
        stop_process_group(server, grace=20)
        stop_process_group(relay, grace=20)
        if use_redis:
            with contextlib.suppress(Exception):
                import redis

                redis.Redis.from_url(REDIS_URL).delete(queue)

    relay_out = relay_log.read_text(errors="replace")
    enqueued = re.search(r"stopped; (\d+) entr", relay_out)
    if "active" not in relay_out or not enqueued or int(enqueued.group(1)) == 0:
        raise RuntimeError(f"the journal relay did not run:\n{relay_out[-3000:]}")
    relay_enqueued = int(enqueued.group(1))

    rows = []
    for clients in levels:
        p, a = results["plain"][clients], results["atlas"][clients]
        rows.append(
            [
                clients,
                p["throughput"],
                p["p50"],
                p["p99"],
                a["throughput"],
                a["p50"],
                a["p99"],
                f"{a['throughput'] / p['throughput']:.0%}",
                p["errors"] + a["errors"],
            ]
        )
    plot(
        "throughput_vs_clients.png",
        {
            "Atlas PUT /api/v1/entities/…": (
                levels,
                [results["atlas"][c]["throughput"] for c in levels],
            ),
            "plain DRF UpdateAPIView": (
                levels,
                [results["plain"][c]["throughput"] for c in levels],
            ),
        },
        title=f"PUT throughput vs concurrent clients (gunicorn, {args.workers} sync workers)",
        xlabel="concurrent clients",
        ylabel="successful PUTs per second",
        ymin0=True,
    )
    cmd = ".venv/bin/python bench/http_throughput.py" + (" --smoke" if smoke else "")
    lines = [
        header(cmd),
        "",
        f"gunicorn {args.workers} sync workers on 127.0.0.1 (a new TCP connection per request,"
        f" as sync workers close each), client threads in one process on the same 2 cores;"
        f" {seconds:.0f} s per endpoint and client count in each of two passes (order swapped),"
        f" {KEYS_PER_CLIENT} keys per client. Journal tasks:"
        f" {'Redis 127.0.0.1:6379/9' if use_redis else 'in-memory broker'}, enqueued by"
        f" `manage.py journal_relay` running beside gunicorn on the same cores"
        f" ({relay_enqueued:,} journal entries this run; the web workers enqueue nothing).",
        "",
        table(
            [
                "clients",
                "plain PUT/s",
                "plain p50 ms",
                "plain p99 ms",
                "Atlas PUT/s",
                "Atlas p50 ms",
                "Atlas p99 ms",
                "Atlas / plain",
                "errors",
            ],
            rows,
        ),
        "",
        image("throughput_vs_clients.png", "throughput vs concurrent clients"),
    ]
    write_section("Against the peers 6. HTTP throughput (gunicorn)", "\n".join(lines))
    write_json(args.json, {"results": results, "workers": args.workers, "levels": levels})


if __name__ == "__main__":
    main()
