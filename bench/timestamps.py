"""Pages and batches with Django's ``timestamptz`` loader and with psycopg's C loader.

    .venv/bin/python bench/timestamps.py [--rounds 6] [--repeat 15]
    .venv/bin/python bench/timestamps.py --smoke        # CI size, scratch output

``atlas.timestamps`` gives each connection psycopg's C loader for ``timestamptz``
where its values are Django's. This measures what that buys where Atlas reads
timestamps: an entity list page (two a row), a changeset's revisions, a history
page, a feed page, and a 1,000-op batch (its locked rows). One namespace is
seeded (1,000 entities, three batches, 60 updates of one entity); each round
runs one child process with Django's loader (the receiver disconnected before
its first connection) and one with the C loader, in alternating order, and the
medians are over every round. Before each child the tables its batches rewrite
are vacuumed and analyzed, so neither loader pays for the other's dead rows.
In-process API requests (no network), so the differences are the loader's share
of what the server does. Only the entity list page and the batch read many
timestamps; the other pages show the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from _common import bench_env, header, parse_part_args, part_parser, table, write_json
from _setup import setup, write_section

HERE = Path(__file__).resolve().parent
DB = os.environ.get("ATLAS_BENCH_DB") or "atlas_bench_timestamps"
TITLE = "Timestamps through psycopg's C loader"
READING = (
    "Reading it: Django's loader parses each value with a regular expression, about 3.3 µs"
    " a value here, where psycopg's C loader takes 0.1 µs (`atlas/timestamps.py`). The entity"
    " list page reads two a row and the batch two a locked row; a changeset's revisions read"
    " one a row; the history and feed pages read their times as numbers (`at_micros`), so"
    " their rows show the noise between the two processes."
)
KEYS = 1000


def content(n: int) -> dict[str, Any]:
    return {"title": f"item {n}", "price": n, "tags": ["a", "b"], "body": "x" * 100}


def batch(ns: str, n: int, keys: int) -> None:
    from django.contrib.auth.models import User

    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.store import EntityKey, baseline

    root = User.objects.filter(is_superuser=True).first()
    ops = [PutOp(EntityKey(ns, "item", f"k{i:05d}"), content(n)) for i in range(keys)]
    changeset_apply(store=baseline, actor=root, ops=ops, rpc=Rpc.BATCH_MUTATE)


def seed(keys: int) -> str:
    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.store import EntityKey, baseline
    from tests.entities.factories import SuperuserFactory

    root = SuperuserFactory(username=f"bench-ts-{uuid.uuid4().hex[:6]}")
    ns = f"bench.ts{uuid.uuid4().hex[:6]}"
    Namespace.objects.create(name=ns)
    for n in range(3):
        batch(ns, n, keys)
    for n in range(60):
        op = PutOp(EntityKey(ns, "item", "k00001"), content(n))
        changeset_apply(store=baseline, actor=root, ops=[op], rpc=Rpc.PUT_ENTITY)
    return ns


def tidy() -> None:
    """VACUUM ANALYZE what the batches rewrite, before each child: every child then
    starts from the same state (no dead rows left by the last one's batches, fresh
    statistics even where autovacuum is off), so the order of the two loaders
    does not decide which one pays for the other's writes."""
    from django.db import connection

    with connection.cursor() as cursor:
        for relation in ("entities_entity", "changesets_revision", "changesets_changeset"):
            cursor.execute(f"VACUUM (ANALYZE) {relation}")


def child(mode: str, ns: str, repeat: int, keys: int) -> dict[str, list[float]]:
    """One process's timings: ``django`` reads with Django's loader, ``fast`` with the C one."""
    from django.db import connection
    from django.db.backends.signals import connection_created

    if mode == "django":
        connection_created.disconnect(dispatch_uid="atlas.fast_timestamps")
        connection.close()  # setup() connected already, with the C loader
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient

    from atlas.timestamps import TIMESTAMPTZ_OID, UtcTimestampLoader
    from changesets.models import Changeset

    client = APIClient()
    client.force_authenticate(User.objects.filter(is_superuser=True).first())
    first = Changeset.objects.filter(namespaces__contains=[ns]).order_by("seq").first()
    assert first is not None
    pages = {
        "entity list page (500 entities)": f"/api/v1/entities?namespace={ns}&page_size=500",
        "a changeset's revisions (500)": f"/api/v1/changesets/{first.id}/revisions?page_size=500",
        "history page (50 revisions)": f"/api/v1/entities/{ns}/item/k00001/history?page_size=50",
        "feed page (1,000 records)": f"/api/v1/changes?limit=1000&namespace={ns}",
    }
    for url in pages.values():
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
    with connection.cursor() as cursor:
        loader = cursor.cursor.adapters.get_loader(TIMESTAMPTZ_OID, 0)
        assert (loader is UtcTimestampLoader) == (mode == "fast"), (mode, loader)
    out: dict[str, list[float]] = {}
    for name, url in pages.items():
        for _ in range(repeat):
            started = time.perf_counter()
            client.get(url)
            out.setdefault(name, []).append(time.perf_counter() - started)
    for n in range(3):
        started = time.perf_counter()
        batch(ns, 1000 + n, keys)
        out.setdefault(f"{keys:,}-op batch (its locked rows)", []).append(
            time.perf_counter() - started
        )
    return out


def main() -> None:
    parser = part_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "NAMESPACE"), help=argparse.SUPPRESS)
    args = parse_part_args(parser)  # --doc: the children inherit ATLAS_BENCH_DOC
    keys = 50 if args.smoke else KEYS
    if args.smoke:
        args.rounds, args.repeat = 2, 2
    bench_env()
    setup(database=DB)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.repeat, keys)))
        return
    ns = seed(keys)
    samples: dict[str, dict[str, list[float]]] = {"django": {}, "fast": {}}
    for n in range(args.rounds):
        for mode in ("django", "fast") if n % 2 == 0 else ("fast", "django"):
            tidy()
            argv = [sys.executable, str(HERE / "timestamps.py"), "--child", mode, ns]
            argv += ["--repeat", str(args.repeat)] + (["--smoke"] if args.smoke else [])
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
            for name, values in json.loads(done.stdout.splitlines()[-1]).items():
                samples[mode].setdefault(name, []).extend(values)
            print(f"round {n + 1}/{args.rounds}: {mode}", flush=True)
    medians = {
        mode: {name: statistics.median(values) * 1000 for name, values in found.items()}
        for mode, found in samples.items()
    }
    write_json(args.json, {"keys": keys, "rounds": args.rounds, "medians_ms": medians})
    rows = []
    for name, slow in medians["django"].items():
        fast = medians["fast"][name]
        saved = f"{slow - fast:+.2f} ({(slow - fast) / slow:.0%})"
        rows.append([name, f"{slow:.2f}", f"{fast:.2f}", saved])
    body = table(["measure (median, ms)", "Django's loader", "C loader", "saved"], rows)
    print(body)
    write_section(
        TITLE,
        header("bench/timestamps.py" + (" --smoke" if args.smoke else ""))
        + f"\n{args.rounds} rounds of {args.repeat} requests a page and 3 batches of {keys:,} ops,"
        " each loader in a process of its own, alternating which goes first.\n\n"
        + body
        + "\n\n"
        + READING,
    )


if __name__ == "__main__":
    main()
