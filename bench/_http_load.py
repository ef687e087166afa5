"""The HTTP benchmark's load, its blocks, and waiting for the post-commit work to finish.

A block is ``seconds`` of PUTs by N client threads; after an Atlas block the
run reads the journal backlog and waits, with no load, until the worker has
published everything (and, with a subscription, delivered it): the drain.
Throughput over block + drain is what the machine sustains, since a backlog
left at a block's end is work the next seconds would still owe.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _common import summary
from _cpu import GROUPS, SERVER_GROUPS, CpuMeter, cpu_delta


def request(port: int, path: str, body: bytes, token: str) -> tuple[int, float]:
    """One PUT on a new connection (gunicorn's sync workers close each); status 0 if the
    connection failed, so a refused or reset request counts as an error, not a crash."""
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
    except OSError:
        return 0, (time.perf_counter() - start) * 1000
    finally:
        conn.close()


@dataclass
class Load:
    """What a run of client threads did."""

    latencies: list[float]
    errors: list[int]
    elapsed: float


def load(
    port: int,
    token: str,
    paths: list[list[str]],
    seconds: float,
    *,
    progress: list[int] | None = None,
    stop: threading.Event | None = None,
) -> Load:
    """``len(paths)`` client threads, each cycling its own paths, for ``seconds`` (or until
    ``stop``); each thread counts its successes in ``progress[i]`` as it goes."""
    latencies: list[float] = []
    errors: list[int] = []
    lock = threading.Lock()
    stop = stop or threading.Event()
    counts = progress if progress is not None else [0] * len(paths)
    stop_at = time.monotonic() + seconds
    payload = "y" * 100

    def client(index: int, mine: list[str], seed: int) -> None:
        n = 0
        local: list[float] = []
        bad: list[int] = []
        while time.monotonic() < stop_at and not stop.is_set() and n < 10_000_000:
            body = json.dumps({"content": {"n": seed * 10_000_000 + n, "payload": payload}})
            status, ms = request(port, mine[n % len(mine)], body.encode(), token)
            if status == 200:
                local.append(ms)
                counts[index] += 1
            else:
                bad.append(status)
            n += 1
        with lock:
            latencies.extend(local)
            errors.extend(bad)

    seed = int(time.time() * 1000) % 100_000
    threads = [
        threading.Thread(target=client, args=(i, mine, seed + i), daemon=True)
        for i, mine in enumerate(paths)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 90)
    return Load(latencies, errors, time.monotonic() - started)


def journal_backlog() -> int:
    """Journal entries still ``committed``: post-commit work not yet done."""
    from changesets.models import JournalEntry

    return JournalEntry.objects.filter(phase="committed").count()


def newest_seq() -> int:
    from changesets.selectors.feed import watermark

    return int(watermark()["seq"])


def subscription_behind(subscription_id: Any, target_seq: int) -> int:
    """Changesets up to ``target_seq`` the subscription has not delivered yet."""
    from changesets.models import Subscription

    cursor = Subscription.objects.filter(pk=subscription_id).values_list("cursor_seq", flat=True)
    return max(0, target_seq - (cursor.first() or 0))


class DrainTimeout(RuntimeError):
    pass


def drain(
    *, subscription_id: Any = None, timeout: float, label: str = "", poll: float = 0.1
) -> float:
    """Seconds until no journal entry is ``committed`` and the subscription (if any) has
    delivered up to the newest seq as of now; a progress line every 5 s when ``label``."""
    target = newest_seq() if subscription_id is not None else 0
    start = time.monotonic()
    report_at = start + 5
    first = None
    while True:
        backlog = journal_backlog()
        behind = subscription_behind(subscription_id, target) if subscription_id else 0
        now = time.monotonic()
        first = (backlog, behind) if first is None else first
        if backlog == 0 and behind == 0:
            return now - start
        if now - start > timeout:
            raise DrainTimeout(
                f"{label or 'drain'}: after {timeout:.0f} s, {backlog:,} journal entries are"
                f" still committed and the subscription is {behind:,} changesets behind"
                f" (started at {first[0]:,} / {first[1]:,}); is the worker running?"
            )
        if label and now >= report_at:
            done = first[0] - backlog
            print(
                f"{label}: {backlog:,} journal entries left"
                + (f", subscription {behind:,} changesets behind" if subscription_id else "")
                + f" ({now - start:.0f} s, {done / (now - start):.0f} entries/s)",
                flush=True,
            )
            report_at += 5
        time.sleep(poll)


@dataclass
class Runner:
    """Runs blocks against one started stack."""

    port: int
    token: str
    meter: CpuMeter | None  # set once the stack runs
    paths: Callable[[str, int], list[list[str]]]
    drain_timeout: float
    subscription_id: Any = None

    def block(
        self,
        impl: str,
        clients: int,
        seconds: float,
        *,
        progress: list[int] | None = None,
        after_load: Callable[[], object] | None = None,
    ) -> dict[str, Any]:
        """One block (and, for Atlas, its drain), with every group's CPU over both."""
        assert self.meter is not None
        before = self.meter.snapshot()
        paths = self.paths(impl, clients)
        result = load(self.port, self.token, paths, seconds, progress=progress)
        at_end = self.meter.snapshot()
        if after_load is not None:
            after_load()
        backlog = journal_backlog() if impl == "atlas" else 0
        behind = 0
        drain_s = 0.0
        if impl == "atlas":
            if self.subscription_id is not None:
                behind = subscription_behind(self.subscription_id, newest_seq())
            label = f"  drain after {impl} x{clients}"
            drain_s = drain(
                subscription_id=self.subscription_id, timeout=self.drain_timeout, label=label
            )
        cpu = cpu_delta(before, self.meter.snapshot())
        ok = len(result.latencies)
        return {
            "impl": impl,
            "clients": clients,
            "seconds": result.elapsed,
            "ok": ok,
            "errors": result.errors,
            "latencies": result.latencies,
            "backlog_end": backlog,
            "subscription_behind_end": behind,
            "drain_s": drain_s,
            "in_block": ok / result.elapsed,
            "sustained": ok / (result.elapsed + drain_s),
            "cpu": cpu,
            "cpu_block": cpu_delta(before, at_end),
        }


def aggregate(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """One implementation at one client count, over its blocks: throughputs, latency,
    and CPU per successful PUT by group (over block + drain)."""
    ok = sum(b["ok"] for b in blocks)
    elapsed = sum(b["seconds"] for b in blocks)
    drained = sum(b["drain_s"] for b in blocks)
    errors = [e for b in blocks for e in b["errors"]]
    cpu = {k: sum(b["cpu"][k] for b in blocks) for k in blocks[0]["cpu"]}
    per_put = {k: (v * 1000 / ok if ok else float("nan")) for k, v in cpu.items()}
    per_put["server"] = sum(per_put[g] for g in SERVER_GROUPS)
    per_put["whole machine"] = sum(per_put[g] for g in GROUPS)
    ours = sum(cpu[g] for g in GROUPS) + cpu["redis"]
    stats = summary([x for b in blocks for x in b["latencies"]])
    return {
        "p50": stats["p50"],
        "p95": stats["p95"],
        "p99": stats["p99"],
        "requests": ok,
        "errors": len(errors),
        "error_statuses": sorted(set(errors))[:5],
        "seconds": elapsed,
        "drain_s": drained,
        "throughput": ok / elapsed if elapsed else float("nan"),
        "sustained": ok / (elapsed + drained) if elapsed else float("nan"),
        "blocks": [
            {k: v for k, v in b.items() if k not in ("latencies", "errors")} for b in blocks
        ],
        "cpu_s": cpu,
        "cpu_ms_per_put": per_put,
        # Busy CPU of the machine outside the measured processes (other jobs: noise).
        "other_cpu_share": (cpu["machine"] - ours) / cpu["machine"] if cpu["machine"] else 0.0,
    }
