"""Key-level reads as the log grows (issue 16): blame, key-filtered history, ``/revisions``
by key, and ``/diff`` of a 10,000-entity namespace, at 10k, 1M and 10M revisions.

    .venv/bin/python bench/keys_blame_diff.py [--sizes 10000,1000000,10000000] [--repeat 30]
    .venv/bin/python bench/keys_blame_diff.py --smoke        # CI size (1k and 5k revisions)

Each size reuses the history benchmark's database (``<base>_hist_<size>``, base
``atlas_bench``): its log is bench/history_pages.py's population (one namespace,
``bench.hist``, of N/100 entities with 100 revisions each, ten revisions per
changeset), made by that module's own function when the database does not have it
yet, so ``make bench`` populates each size once for both parts. On top, once per
database, fixtures written through the write service (``changeset_apply``, so their
changed keys, chain and journal are what a client's writes leave):

- **blame entities**: ``--entities`` entities in ``bench.hist`` itself (its key
  index terms are the ones that grow with the log), twelve leaves each (nested
  objects, an array), ``--history`` revisions each; every revision changes ``/v``,
  the others change every 2nd … 50th revision, and five leaves never change after
  the create, so blame walks each entity's whole history;
- **a diff namespace** ``bench.kbd.diff`` of ``--diff-entities`` entities, created
  in changesets of 1,000 (point A), then one changeset that updates 10%, deletes
  1% and creates 1% (point B);
- a marker entity (``bench.kbd.meta``) naming the points, so a later run finds them.

Then every request below, sizes interleaved: one child process per size serves the
requests in-process (Django's test client, token auth, the whole middleware and view
stack; bench/_scale_measure.py's protocol), and this process drives them in lockstep,
each request at every size in turn, ``--repeat`` rounds after a warm pass, each call on
another blame entity; so a load spike on a shared machine hits every size alike. Per
request: p50/p95 of wall time, the SQL time (each statement timed around the driver
call: bench/_sqltime.py), the statements, and ``EXPLAIN (ANALYZE, BUFFERS)`` of the
statement slowest by its plan. Target: blame and key-filtered history flat (largest
size within 1.3× of the smallest).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import history_pages as hp
from _common import bench_env, database, header, parse_part_args, part_parser, pct, write_json
from _keys_report import TITLE, report
from _keys_timing import USER, Fetched, client, fetch
from _scale_measure import SizeServer, claim_stdout, in_process, serve
from _setup import database_url, setup, write_section

NS = hp.NS
DIFF_NS = "bench.kbd.diff"
META = ("bench.kbd.meta", "fixture", "kbd")
FIXTURE_VERSION = 1
API = "/api/v1"
# Seconds per revision of bench/history_pages.py's population on the 2-core machine
# (the rate of a size populated in this run replaces it for the next).
POPULATE_RATE = 60e-6
# Leaves that change every k-th revision (the others never change after the create).
EVERY = {
    "/price": 3,
    "/stock/count": 2,
    "/stock/warehouse/city": 50,
    "/profile/email": 25,
    "/tags": 10,
    "/flags/featured": 7,
}


def blame_doc(i: int, step: int) -> dict[str, Any]:
    """Blame entity ``i`` after revision ``step`` (0 is the create)."""

    def at(pointer: str) -> int:
        return step // EVERY[pointer]

    return {
        "v": step,
        "payload": hp.PAYLOAD,
        "title": f"item {i}",
        "price": 100 + at("/price"),
        "stock": {
            "count": at("/stock/count"),
            "warehouse": {"city": f"city-{at('/stock/warehouse/city')}", "zip": f"{i:05d}"},
        },
        "profile": {"owner": f"owner-{i}", "email": f"o{i}.{at('/profile/email')}@example.com"},
        "tags": ["a", f"t{at('/tags')}"],
        "flags": {"archived": False, "featured": at("/flags/featured") % 2 == 1},
    }


def diff_doc(j: int, changed: bool = False) -> dict[str, Any]:
    return {
        "n": j,
        "name": f"entity {j}",
        "price": (j % 97) + (1000 if changed else 0),
        "tags": ["x", "y"],
        "spec": {"w": j % 13 + (1 if changed else 0), "h": j % 7},
    }


def write_fixtures(entities: int, history: int, diff_entities: int) -> dict[str, Any]:
    """The fixtures, in one transaction (all or nothing: a rerun starts clean)."""
    from django.db import transaction

    from changesets.models import Rpc
    from changesets.ops import DeleteOp, PutOp
    from changesets.services.apply import changeset_apply
    from entities.services import namespace_create
    from entities.store import EntityKey, baseline
    from tests.entities.factories import SuperuserFactory

    started = time.perf_counter()
    with transaction.atomic():
        actor = SuperuserFactory(username="bench-kbd-writer")

        def apply(ops: list, comment: str) -> str:
            result = changeset_apply(
                store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE, comment=comment
            )
            assert result.changeset is not None
            return str(result.changeset.id)

        keys = [EntityKey(NS, "item", f"kbd-{i:03d}") for i in range(entities)]
        points: dict[str, str] = {}
        for step in range(history):
            ops = [PutOp(key, blame_doc(i, step)) for i, key in enumerate(keys)]
            point = apply(ops, f"kbd blame {step}")
            if step == history // 2:
                points["blame_half"] = point
        points["before_diff"] = point
        for name in (DIFF_NS, META[0]):
            namespace_create(name=name)
        dkey = lambda j: EntityKey(DIFF_NS, "item", f"d{j:05d}")  # noqa: E731
        for start in range(0, diff_entities, 1000):
            ops = [
                PutOp(dkey(j), diff_doc(j)) for j in range(start, min(start + 1000, diff_entities))
            ]
            points["diff_a"] = apply(ops, f"kbd diff create {start}")
        ops = [PutOp(dkey(j), diff_doc(j, True)) for j in range(0, diff_entities, 10)]
        ops += [DeleteOp(dkey(j)) for j in range(1, diff_entities, 100)]
        ops += [PutOp(dkey(diff_entities + j), diff_doc(j)) for j in range(diff_entities // 100)]
        points["diff_b"] = apply(ops, "kbd diff B")
        marker = {
            "version": FIXTURE_VERSION,
            "shape": [entities, history, diff_entities],
            "points": points,
            "seconds": round(time.perf_counter() - started, 1),
        }
        apply([PutOp(EntityKey(*META), marker)], "kbd fixtures written")
    return marker


def fixtures(entities: int, history: int, diff_entities: int) -> dict[str, Any]:
    """The marker of this database's fixtures, writing them first if absent."""
    from entities.store import EntityKey, baseline

    found = baseline.get(EntityKey(*META))
    shape = [entities, history, diff_entities]
    if found is not None:
        marker = found.content
        if marker["version"] != FIXTURE_VERSION or marker["shape"] != shape:
            raise SystemExit(
                f"this database's fixtures are {marker['shape']} (v{marker['version']}), not"
                f" {shape} (v{FIXTURE_VERSION}): drop the database or run with the same sizes"
            )
        return {**marker, "written_now": False}
    print(f"  writing fixtures {shape} through the write service ...", flush=True)
    marker = write_fixtures(entities, history, diff_entities)
    print(f"  fixtures written in {marker['seconds']:.0f} s", flush=True)
    return {**marker, "written_now": True}


def requests(marker: dict[str, Any], background: int) -> dict[str, Any]:
    """label -> function(round) returning the URLs that round reads (several: a walk)."""
    entities, history, diff_entities = marker["shape"]
    p = marker["points"]
    ent = f"{API}/entities/{NS}/item"
    fixture = lambda i: f"{ent}/kbd-{i % entities:03d}"  # noqa: E731
    other = lambda i: f"{ent}/e{(i * 7919) % background:07d}"  # noqa: E731
    diff = f"{API}/diff?namespace={DIFF_NS}&page_size=500"
    return {
        f"blame ({history} revisions, 12 leaves)": lambda i: [f"{fixture(i)}/blame"],
        "blame as of half-way back": lambda i: [f"{fixture(i)}/blame?as_of={p['blame_half']}"],
        "blame, populated entity (100 revisions)": lambda i: [f"{other(i)}/blame"],
        "history, no key": lambda i: [f"{fixture(i)}/history"],
        "history ?key=/v (every revision)": lambda i: [f"{fixture(i)}/history?key=/v"],
        "history ?key=/profile/email (every 25th)": lambda i: [
            f"{fixture(i)}/history?key=/profile/email"
        ],
        "history ?key=/stock (an object)": lambda i: [f"{fixture(i)}/history?key=/stock"],
        "history ?key=/payload (the create only)": lambda i: [f"{fixture(i)}/history?key=/payload"],
        "history ?key=/payload, populated entity": lambda i: [f"{other(i)}/history?key=/payload"],
        "revisions ?namespace, no key": lambda i: [f"{API}/revisions?namespace={NS}"],
        "revisions ?key=/profile/email (fixtures only)": lambda i: [
            f"{API}/revisions?namespace={NS}&key=/profile/email"
        ],
        "revisions ?key=/v (every revision)": lambda i: [f"{API}/revisions?namespace={NS}&key=/v"],
        "revisions ?key=/payload (every create)": lambda i: [
            f"{API}/revisions?namespace={NS}&key=/payload"
        ],
        "entity diff A→B": lambda i: [
            f"{API}/entities/{DIFF_NS}/item/d{(i * 10) % diff_entities:05d}/diff"
            f"?from={p['diff_a']}&to={p['diff_b']}"
        ],
        "/diff A→B, first page (500)": lambda i: [f"{diff}&from={p['diff_a']}&to={p['diff_b']}"],
        f"/diff A→B, all pages (~{diff_entities * 12 // 100:,} entities)": lambda i: [
            f"{diff}&from={p['diff_a']}&to={p['diff_b']}",
            "walk",
        ],
        f"/diff empty→A, all pages ({diff_entities:,} creates)": lambda i: [
            f"{diff}&from={p['before_diff']}&to={p['diff_a']}",
            "walk",
        ],
    }


def child(args: argparse.Namespace) -> None:
    """``--serve N``: bound to this size's database, populate and write the fixtures if
    missing, then serve the requests to the parent (bench/_scale_measure.py's protocol),
    each call of a request on the next blame entity."""
    claim_stdout()  # the protocol's; populating prints
    bench_env()
    setup(settings="bench.settings", database=args.database)
    from django.db import connection

    from entities.models import Namespace

    total, populated = args.serve, 0.0
    if not Namespace.objects.filter(name=NS).exists():
        print(f"  populating {total:,} revisions (bench/history_pages.py) ...", flush=True)
        populated = hp.populate_atlas(total)["total_s"]
    marker = fixtures(args.entities, args.history, args.diff_entities)
    # Statistics and the visibility map for the fixtures' rows, as autovacuum would leave
    # them (without it their index-only scans fetch every heap row); the whole database,
    # whatever its tables, and quick where nothing changed since the last run.
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    background = max(total // hp.PER_ENTITY, hp.PER_CHANGESET)
    reqs = requests(marker, background)
    http, headers = client()
    calls = dict.fromkeys(reqs, 0)

    def get(_user: str, label: str) -> Fetched:
        calls[label] += 1
        return fetch(http, headers, reqs[label](calls[label]))

    hello = {
        "pages": [(USER, label, label) for label in reqs],
        "headers": {},
        "facts": {"total": total, "populate_s": populated, "fixtures": marker},
        "database_url": database_url(args.database),
    }
    serve({(USER, label): label for label in reqs}, get, hello, describe=lambda r: r.info)


def main() -> None:
    parser = part_parser(__doc__, doc_option=False)
    parser.add_argument("--sizes", default="10000,1000000,10000000", help="revisions")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--entities", type=int, default=20, help="blame entities")
    parser.add_argument("--history", type=int, default=300, help="revisions per blame entity")
    parser.add_argument("--diff-entities", type=int, default=10_000)
    parser.add_argument(
        "--seconds", type=float, default=60, help="per request, all sizes: then 3 rounds only"
    )
    parser.add_argument("--budget", type=float, default=3600, help="seconds for populations")
    parser.add_argument(
        "--reuse-only",
        action="store_true",
        help="measure only sizes whose database is populated (make bench: history's)",
    )
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--database", default=None, help=argparse.SUPPRESS)
    args = parse_part_args(parser)
    if args.smoke:
        args.sizes, args.repeat, args.seconds = "1000,5000", 5, 10
        args.entities, args.history, args.diff_entities = 3, 30, 500
    if args.serve is not None:
        child(args)
        return
    bench_env()
    setup(settings="bench.settings", database=database(args.smoke))  # for the header
    sizes, skipped = plan_sizes(args)
    results = measure(args, sizes)
    command = "bench/keys_blame_diff.py" + (" --smoke" if args.smoke else f" --sizes {args.sizes}")
    text = header(f".venv/bin/python {command}") + "\n\n" + report(results, skipped, args)
    write_section(TITLE, text)
    write_json(args.json, {"sizes": results, "skipped": skipped})


def plan_sizes(args: argparse.Namespace) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(revisions, database) of the sizes to measure; the others with why not: with
    ``--reuse-only`` a database not populated yet, else one whose population would not
    fit what is left of ``--budget``."""
    sizes: list[tuple[int, str]] = []
    skipped: list[tuple[int, str]] = []
    left = args.budget
    for total in [int(s) for s in args.sizes.split(",")]:
        name = f"{database(args.smoke)}_hist_{hp.label(total)}"
        ready = hp.already_populated(name, ())
        if args.reuse_only and not ready:
            skipped.append((total, f"{name} is not populated (the history part skipped it)"))
            continue
        estimate = 0.0 if ready else POPULATE_RATE * total * 1.2
        if estimate > left:
            why = f"populating it was estimated at {estimate:.0f} s, {left:.0f} s were left"
            skipped.append((total, why))
            continue
        left -= estimate
        sizes.append((total, name))
    return sizes, skipped


def measure(args: argparse.Namespace, sizes: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """Every request at every size, interleaved (one child per size, driven in lockstep)."""
    servers: list[SizeServer] = []
    try:
        for total, name in sizes:  # one at a time: a population runs alone
            print(f"keys: {total:,} revisions in {name} ...", flush=True)
            argv = [sys.executable, __file__, "--serve", str(total), "--database", name]
            argv += ["--entities", str(args.entities), "--history", str(args.history)]
            argv += ["--diff-entities", str(args.diff_entities)]
            servers.append(SizeServer(str(total), argv))
        keys = list(servers[0].urls)
        timed = in_process(servers, keys, args.repeat, seconds=args.seconds)
    finally:
        for server in servers:
            server.close()
    out = []
    for server in servers:
        results = {}
        for key, record in timed[server.size].items():
            results[key[1]] = {**record, "p95": pct(record["samples"], 95)}
            print(
                f"  {server.size:>9} {key[1]:52} p50 {record['p50']:8.2f} ms"
                f"  SQL {record['sql_ms']:7.2f} ms  {record['queries']:3} statements"
                f"  {record['rows']:6} rows",
                flush=True,
            )
        out.append({**server.facts, "results": results})
    return out


if __name__ == "__main__":
    main()
