"""HTTP PUT throughput of Atlas vs a plain DRF update endpoint, in the production shape.

    .venv/bin/python bench/http_throughput.py [--smoke] [--seconds 20] [--clients 1,4,8]
        [--rounds N] [--subscription] [--sustained SECONDS] [--doc PATH] [--plots DIR]
        [--json PATH]

Runs what ``make run`` runs (``atlas.devrun.commands``): gunicorn with
atlas/deploy/gunicorn.conf.py and 2 workers, and ``celery -A atlas worker -B``
with its default concurrency and the journal relay in its main process, with
``bench.settings`` (Atlas plus ``PUT /bench/plain/<namespace>/<slug>``, a plain
``UpdateAPIView`` over an untracked model), on Redis 127.0.0.1:6379 db 9 with a
queue of this run (the filesystem broker, said loudly, when Redis is down).
Nothing is published by hand: the worker first drains whatever journal
backlog the database holds, then at 1, 4 and 8 client threads come blocks of
``--seconds`` in the order plain, Atlas, Atlas, plain (``--rounds N``: N times over,
every client count in each round, the targets judged on the median of the rounds'
own ratios). After each Atlas block
the run records the backlog and waits for the worker to drain it; throughput
over block + drain is what Atlas sustains, since work left at a block's end is
owed by the next seconds. Every process's CPU (web, worker, PostgreSQL, this
load generator) is counted per successful PUT (bench/_stack.py).

``--subscription`` runs the same with one active subscription to a receiver
in this process; ``--sustained SECONDS`` runs Atlas alone at the highest client
count for that long, sampling the backlog every second (its own section).
Targets (issue 15) are printed met or missed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, NoReturn

from _common import bench_env, database, parse_part_args, part_parser, write_json
from _http_load import (
    Runner,
    aggregate,
    drain,
    journal_backlog,
    load,
    newest_seq,
    subscription_behind,
)
from _http_report import main_section, round_ratios, sustained_section, targets, verdict
from _setup import setup, write_section
from _stack import Broker, Receiver, Stack, choose_broker

KEYS_PER_CLIENT = 10
MAIN = "Against the peers 6. HTTP throughput (gunicorn)"
SUBSCRIBED = "Against the peers 6. HTTP throughput (gunicorn), one webhook subscription"
SUSTAINED = "HTTP sustained run (backlog over time)"


def parse_args() -> argparse.Namespace:
    parser = part_parser(__doc__, smoke="1 s blocks at 1 and 2 clients", plots_option=True)
    parser.add_argument("--seconds", type=float, default=20.0, help="per block")
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument(
        "--rounds", type=int, default=1, help="plain, Atlas, Atlas, plain this many times"
    )
    parser.add_argument("--subscription", action="store_true", help="one active webhook")
    parser.add_argument("--sustained", type=float, default=0, help="Atlas only, this long")
    parser.add_argument("--drain-timeout", type=float, default=600, help="seconds, each drain")
    return parse_part_args(parser)


def populate(rid: str, clients: int) -> tuple[Any, str, Callable[[str, int], list[list[str]]]]:
    """A writer with a token, and ``KEYS_PER_CLIENT`` keys per client on both sides."""
    from atlas.services import api_token_create
    from bench.plain.models import PlainItem
    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.services import role_grant
    from entities.store import EntityKey, baseline
    from tests.entities.factories import SuperuserFactory, UserFactory

    root = SuperuserFactory(username="bench-root")
    writer = UserFactory(username="bench-http-writer")
    token = api_token_create(user=writer, name="bench")[1]
    ns = Namespace.objects.create(name=f"bench.http{rid}")
    role_grant(namespace=ns, principal=writer, role="writer")
    slugs = [f"c{c}-k{k}" for c in range(clients) for k in range(KEYS_PER_CLIENT)]
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

    def paths(impl: str, count: int) -> list[list[str]]:
        prefix = (
            f"/api/v1/entities/{ns.name}/item/" if impl == "atlas" else f"/bench/plain/{plain_ns}/"
        )
        return [[prefix + f"c{c}-k{k}" for k in range(KEYS_PER_CLIENT)] for c in range(count)]

    return root, token, paths


def run_blocks(runner: Runner, levels: list[int], seconds: float, rounds: int) -> dict[str, Any]:
    """``rounds`` rounds; in each, plain, Atlas, Atlas, plain at every client count.

    Each round's Atlas/plain ratio compares blocks at most a minute or so apart, so a
    load spike or a drift of the shared machine moves both sides of one pair; the
    targets are judged on the median of the rounds' ratios (kept as the Atlas
    aggregate's ``pairs``)."""
    done: dict[int, dict[str, list[dict[str, Any]]]] = {
        c: {"plain": [], "atlas": []} for c in levels
    }
    per_round: dict[int, list[dict[str, Any]]] = {c: [] for c in levels}
    for r in range(rounds):
        for clients in levels:
            this: dict[str, list[dict[str, Any]]] = {"plain": [], "atlas": []}
            for impl in ("plain", "atlas", "atlas", "plain"):
                b = runner.block(impl, clients, seconds)
                this[impl].append(b)
                label = f"round {r + 1}/{rounds} {impl} x{clients}"
                print(f"  {label}: {describe(b, impl)}", flush=True)
            for impl, blocks in this.items():
                done[clients][impl] += blocks
            pair = round_ratios(aggregate(this["atlas"]), aggregate(this["plain"]))
            per_round[clients].append(pair)
            print(
                f"round {r + 1}/{rounds}, {clients} clients: Atlas/plain over block + drain"
                f" {pair['share']:.0%}, whole-machine CPU per PUT {pair['cpu']:.2f}x",
                flush=True,
            )
    results: dict[str, Any] = {"plain": {}, "atlas": {}}
    for clients in levels:
        for impl in ("plain", "atlas"):
            results[impl][clients] = aggregate(done[clients][impl])
        results["atlas"][clients]["pairs"] = per_round[clients]
        a, p = results["atlas"][clients], results["plain"][clients]
        print(
            f"{clients} clients: plain {p['throughput']:.0f}/s, Atlas {a['throughput']:.0f}/s"
            f" in block, {a['sustained']:.0f}/s over block + drain"
            f" ({a['sustained'] / p['sustained']:.0%}); whole-machine CPU per PUT"
            f" {a['cpu_ms_per_put']['whole machine']:.1f} vs"
            f" {p['cpu_ms_per_put']['whole machine']:.1f} ms",
            flush=True,
        )
    return results


def describe(b: dict[str, Any], impl: str) -> str:
    """One block on one line: its rate, and for Atlas its backlog and drain."""
    text = f"{b['in_block']:.0f} PUT/s in {b['seconds']:.1f} s"
    if impl == "atlas":
        text += (
            f", backlog {b['backlog_end']:,} at the end, drained in {b['drain_s']:.1f} s"
            f" -> {b['sustained']:.0f} PUT/s over block + drain"
        )
    if b["errors"]:
        text += f", {len(b['errors'])} errors"
    return text


def run_sustained(runner: Runner, clients: int, seconds: float) -> dict[str, Any]:
    """Atlas alone for ``seconds``; once a second, the PUTs of that second and the backlog."""
    from django.db import connection

    progress = [0] * clients
    stop = threading.Event()
    samples: list[dict[str, Any]] = []

    def sample() -> None:
        start, last, k = time.monotonic(), 0, 1
        try:
            while not stop.wait(max(0.0, start + k - time.monotonic())):
                done, backlog = sum(progress), journal_backlog()
                sub = runner.subscription_id
                behind = subscription_behind(sub, newest_seq()) if sub is not None else 0
                samples.append({"t": k, "puts": done - last, "backlog": backlog, "behind": behind})
                if k % 10 == 0:
                    print(f"  {k} s: {done - last} PUT/s, backlog {backlog:,}", flush=True)
                last, k = done, k + 1
        finally:
            connection.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        block = runner.block("atlas", clients, seconds, progress=progress, after_load=stop.set)
    finally:
        stop.set()
        sampler.join(10)
    run = aggregate([block])
    run.update(clients=clients, samples=samples, backlog_end=block["backlog_end"])
    print(
        f"sustained: {run['throughput']:.0f} PUT/s, backlog {block['backlog_end']:,} at the end,"
        f" drained in {block['drain_s']:.1f} s -> {run['sustained']:.0f} PUT/s",
        flush=True,
    )
    return run


def on_sigterm(signum: int, _frame: object) -> NoReturn:
    """SIGTERM unwinds like Ctrl-C, so the ``finally`` stops the children."""
    raise SystemExit(128 + signum)


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)
    seconds = 1.0 if args.smoke else args.seconds
    levels = [1, 2] if args.smoke else [int(c) for c in args.clients.split(",")]
    bench_env()
    rid = uuid.uuid4().hex[:8]
    broker = choose_broker(rid)
    # This process enqueues too (a new subscription's first pump): to the same queue.
    os.environ["CELERY_BROKER_URL"] = broker.url
    os.environ["CELERY_TASK_DEFAULT_QUEUE"] = broker.queue
    setup(settings="bench.settings", database=database(args.smoke))
    from changesets.models import Subscription

    root, token, paths = populate(rid, max(levels))
    info: dict[str, Any] = {
        "subscription": args.subscription,
        "broker": broker.describe(),
        "seconds": seconds,
        "rounds": args.rounds,
        "keys": KEYS_PER_CLIENT,
        "cores": os.cpu_count(),
        # Earlier runs' subscriptions would add deliveries (or retries) to this one's work.
        "deactivated": Subscription.objects.filter(active=True).update(active=False),
        "cmd": " ".join([".venv/bin/python bench/http_throughput.py", *sys.argv[1:]]),
        "posts": 0,
        "post_bytes": 0,
        "warm_clients": min(4, max(levels)),  # every gunicorn worker, on keys that exist
    }
    runner = Runner(port=0, token=token, meter=None, paths=paths, drain_timeout=args.drain_timeout)
    out: dict[str, Any]
    if args.sustained:
        run = partial(run_sustained, clients=max(levels), seconds=args.sustained)
        out = {"sustained": measure(args, broker, info, root, runner, run)}
    else:
        run = partial(run_blocks, levels=levels, seconds=seconds, rounds=args.rounds)
        out = {"results": measure(args, broker, info, root, runner, run), "levels": levels}
    report(info, out, args.json)


def measure(
    args: argparse.Namespace,
    broker: Broker,
    info: dict[str, Any],
    root: Any,
    runner: Runner,
    body: Callable[[Runner], dict[str, Any]],
) -> dict[str, Any]:
    """Start the stack, warm up, drain, run ``body(runner)``; whatever happens, stop the
    children, delete the queue, close the receiver and deactivate the subscription."""
    from changesets.models import Subscription

    receiver: Receiver | None = None
    try:
        with Stack(broker) as stack:
            info.update(
                web_cmd=stack.shown("web"),
                worker_cmd=stack.shown("worker"),
                concurrency=stack.concurrency(),
            )
            runner.port, runner.meter = stack.port, stack.meter()
            if args.subscription:
                receiver, runner.subscription_id = subscribe(root, f"bench {broker.queue}")
            warm_up_and_drain(runner, info, 0.5 if args.smoke else 1.0)
            return body(runner)
    finally:
        if runner.meter is not None:
            runner.meter.close()
        if receiver is not None:
            info.update(posts=receiver.posts, post_bytes=receiver.bytes)
            receiver.close()
        if runner.subscription_id is not None:
            Subscription.objects.filter(pk=runner.subscription_id).update(active=False)


def subscribe(root: Any, name: str) -> tuple[Receiver, Any]:
    """One active subscription, every namespace, from now on, to a receiver here."""
    from changesets.outbox.subscriptions import subscription_create

    receiver = Receiver()
    subscription = subscription_create(
        actor=root, name=name, url=receiver.url, namespaces=[], start="now"
    )
    return receiver, subscription.pk


def warm_up_and_drain(runner: Runner, info: dict[str, Any], seconds: float) -> None:
    """Warm every web worker on both endpoints, then let the worker drain the database's
    backlog (earlier runs' and other parts' writes, and the warm-up's) before any block."""
    info["initial_backlog"] = journal_backlog()
    for impl in ("plain", "atlas"):
        load(runner.port, runner.token, runner.paths(impl, info["warm_clients"]), seconds)
    print(f"draining {journal_backlog():,} journal entries before the first block", flush=True)
    info["initial_drain_s"] = drain(
        subscription_id=runner.subscription_id,
        timeout=runner.drain_timeout,
        label="draining before the first block",
    )
    print(f"drained in {info['initial_drain_s']:.1f} s", flush=True)


def report(info: dict[str, Any], out: dict[str, Any], json_path: str | None) -> None:
    """Targets on stdout, the section in the doc, the JSON for run_all's summary."""
    if "sustained" in out:
        run = out["sustained"]
        info["other_cpu_share"] = run["other_cpu_share"]
        write_section(SUSTAINED, sustained_section(info, run))
        rate = run["throughput"]
        met = verdict(run["backlog_end"] < rate).strip("*")
        print(f"target: backlog at the end < 1 s of writes: {met}")
    else:
        results, levels = out["results"], out["levels"]
        shares = [results[i][c]["other_cpu_share"] for i in ("plain", "atlas") for c in levels]
        info["other_cpu_share"] = max(shares)
        out["targets"] = targets(results, levels, info["subscription"])
        for row in out["targets"]:
            met = verdict(row["met"]).strip("*")
            print(f"target: {row['target']} at {row['clients']} clients: {row['value']}: {met}")
        title = SUBSCRIBED if info["subscription"] else MAIN
        write_section(title, main_section(info, results, levels))
    if info["other_cpu_share"] > 0.1:
        print(
            f"!!! other jobs used up to {info['other_cpu_share']:.0%} of the machine's busy CPU"
            " during the measurement: the figures are noisy !!!",
            flush=True,
        )
    out["info"] = info
    write_json(json_path, out)


if __name__ == "__main__":
    main()
