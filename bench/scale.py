"""Every page at 100k, 1M (and 10M) changesets (issue 18): API lists and admin pages.

    .venv/bin/python bench/scale.py --sizes 100k,1m,10m [--runs 11] [--label warm] [--no-http]
    .venv/bin/python bench/scale.py --report      # the docs section and plot from saved runs

Each size has its own database on the benchmark server (``atlas_scale_<size>``, or
``<ATLAS_BENCH_DB>_scale_<size>``), populated once by server-side SQL
(``bench/scale_populate.py`` says what the log looks like and why it bypasses
the write service) and reused by later runs (a populated database is never
populated again). Then every API list filter and every admin page is requested
as a superuser (``root``) and as a staff user who reads two namespaces
(``rita``: a 3% one and a 0.02% one), every size in turn: each size is served
in-process by a child of its own (``--serve``; Django's test client, the whole
middleware, auth, view and template stack, no socket), then over a live
gunicorn per size as ``make run`` serves it (2 sync workers, atlas.settings).
bench/_scale_measure.py says how the sizes are interleaved, what "warm" means
and how a request's time is split (SQL at the client, rendering, the rest of
Python; blocks read from outside shared buffers). Each page's slowest
statement is re-run under ``EXPLAIN (ANALYZE, BUFFERS)`` with its parameters
and saved with the timings in ``docs/benchmarks/scale-<size>-<label>.json``;
then (and alone with ``--report``) the section of ``docs/benchmarks.md``,
``docs/benchmarks/scale.png`` and ``docs/benchmarks/scale-plans.md`` are
written from every saved file.

The machine is shared (2 cores, several engineers): the milliseconds are
indicative, the plans and buffer counts are the evidence.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import scale_populate as pop
from _common import bench_env, plots_dir
from _scale_measure import SizeServer, claim_stdout, in_process, over_http, serve
from _scale_report import SIZES, report
from _setup import ROOT, database_url, setup

ADMIN = "/admin/changesets"
API = "/api/v1"


def scale_database(size: str) -> str:
    """``atlas_scale_<size>``, or ``<ATLAS_BENCH_DB>_scale_<size>`` when a run names its
    own base (two checkouts on one server must not share a population)."""
    base = os.environ.get("ATLAS_BENCH_DB")
    return f"{base}_scale_{size}" if base else f"atlas_scale_{size}"


def users() -> dict[str, Any]:
    """``root`` (superuser) and ``rita`` (staff, reader of a mid and a rare namespace)."""
    from django.contrib.auth.models import Permission, User

    from atlas.services import api_token_create
    from entities.models import Namespace
    from entities.services import role_grant

    root, made = User.objects.get_or_create(
        username="root", defaults={"is_staff": True, "is_superuser": True}
    )
    rita, rita_made = User.objects.get_or_create(username="rita", defaults={"is_staff": True})
    if rita_made:
        for name in (pop.MID_NS, pop.RARE_NS):
            role_grant(namespace=Namespace.objects.get(name=name), principal=rita, role="reader")
    # Django's model view permissions open the admin's pages (docs/admin.md).
    rita.user_permissions.add(
        *Permission.objects.filter(
            codename__in=[
                "view_changeset",
                "view_revision",
                "view_journalentry",
                "view_entity",
                "view_branch",
                "view_erasure",
            ]
        )
    )
    return {
        "superuser": (root, api_token_create(user=root, name="scale")[1]),
        "scoped": (rita, api_token_create(user=rita, name="scale")[1]),
    }


def facts() -> dict[str, Any]:
    """Values the page list needs: an old time and seq, a changeset id, a busy key.

    Read through the selectors (not the log's columns), so the benchmark keeps
    working whatever the tables' physical layout.
    """
    from changesets.selectors.log import changeset_list, entity_history, log_head
    from entities.store import EntityKey

    head = log_head()
    assert head is not None and head.seq
    total = head.seq
    newest = changeset_list(namespaces=None, limit=1)[0]
    old = changeset_list(namespaces=None, before_seq=max(total // 50, 1) + 1, limit=1)[0]
    busy = entity_history(key=EntityKey(pop.BUSY_NS, "item", "obj-0"), limit=1)
    mid = changeset_list(namespaces=None, namespace=pop.MID_NS, limit=1)
    return {
        "total": total,
        "old_seq": old.seq,
        "old_at": old.at.isoformat().replace("+00:00", "Z"),
        "old_day": old.at.date().isoformat(),
        "page2000_seq": max(total - 2000 * 50, total // 100),
        "id": str(mid[0].id if mid else newest.id),
        "mid_seq": mid[0].seq if mid else newest.seq,
        "busy_slug": "obj-0",
        "busy_seq": busy[0].seq if busy else total,
    }


def pages(f: dict[str, Any], user: str, offset: bool) -> list[tuple[str, str]]:
    """(label, url) of every page timed, as ``user`` asks it.

    The scoped user asks the same URLs, except that her busy entity is in the
    namespace she reads. ``offset``: the URLs of the code before issue 18
    (``?p=`` pages, the date hierarchy) for the pages whose URL changed.
    """
    return api_pages(f, user) + admin_pages(f, user, offset)


def api_pages(f: dict[str, Any], user: str) -> list[tuple[str, str]]:
    mid, rare = pop.MID_NS, pop.RARE_NS
    ns = pop.BUSY_NS if user == "superuser" else mid
    return [
        ("api changesets", f"{API}/changesets"),
        ("api changesets namespace=mid", f"{API}/changesets?namespace={mid}"),
        ("api changesets namespace=rare", f"{API}/changesets?namespace={rare}"),
        ("api changesets author=busy", f"{API}/changesets?author={pop.BUSY_AUTHOR}"),
        ("api changesets author=tiny", f"{API}/changesets?author={pop.TINY_AUTHOR}"),
        ("api changesets rpc=common", f"{API}/changesets?rpc={pop.COMMON_RPC}"),
        ("api changesets rpc=rare", f"{API}/changesets?rpc={pop.RARE_RPC}"),
        ("api changesets branch=baseline", f"{API}/changesets?branch="),
        ("api changesets branch=feature", f"{API}/changesets?branch={pop.BRANCH}"),
        ("api changesets until=old", f"{API}/changesets?until={f['old_at']}"),
        ("api changesets since=old", f"{API}/changesets?since={f['old_at']}"),
        (
            "api changesets namespace=mid&author=busy",
            f"{API}/changesets?namespace={mid}&author={pop.BUSY_AUTHOR}",
        ),
        (
            "api changesets namespace=mid&rpc=rare",
            f"{API}/changesets?namespace={mid}&rpc={pop.RARE_RPC}",
        ),
        ("api changeset detail", f"{API}/changesets/{f['id']}"),
        ("api entities namespace=mid", f"{API}/entities?namespace={mid}"),
        (
            "api entities as_of_time=old",
            f"{API}/entities?namespace={mid}&as_of_time={f['old_at']}",
        ),
        ("api entity history busy", f"{API}/entities/{ns}/item/obj-0/history"),
        ("api revisions namespace=mid", f"{API}/revisions?namespace={mid}"),
        ("api revisions namespace=rare", f"{API}/revisions?namespace={rare}"),
        ("api changes feed", f"{API}/changes?limit=100"),
        ("api entities deleted=true", f"{API}/entities?namespace={mid}&deleted=true"),
        ("api revisions namespace=mid key=/price", f"{API}/revisions?namespace={mid}&key=/price"),
        # A key every create sets and no update changes: matched by the namespace's
        # every create, most of them old (the superuser's is the busy namespace).
        ("api revisions key=/name", f"{API}/revisions?namespace={ns}&key=/name"),
        (
            "api entity history busy key=/price",
            f"{API}/entities/{ns}/item/obj-0/history?key=/price",
        ),
        ("api entity blame busy", f"{API}/entities/{ns}/item/obj-0/blame"),
    ]


def admin_pages(f: dict[str, Any], user: str, offset: bool) -> list[tuple[str, str]]:
    mid = pop.MID_NS
    ns = pop.BUSY_NS if user == "superuser" else mid
    cl = f"{ADMIN}/changeset/"
    old = f["old_day"].split("-")
    far = f"{cl}?p=2000" if offset else f"{cl}?before={f['page2000_seq']}"
    until = (
        f"{cl}?at__year={int(old[0])}&at__month={int(old[1])}&at__day={int(old[2])}"
        if offset
        else f"{cl}?until={f['old_day']}"
    )
    page2 = (
        f"{cl}?q={f['busy_slug']}&p=2"
        if offset
        else f"{cl}?q={f['busy_slug']}&before={f['busy_seq']}"
    )
    return [
        ("admin changelist", cl),
        ("admin changelist far page", far),
        ("admin changelist author=busy", f"{cl}?author={pop.BUSY_AUTHOR}"),
        ("admin changelist author=tiny", f"{cl}?author={pop.TINY_AUTHOR}"),
        ("admin changelist rpc=common", f"{cl}?rpc__exact={pop.COMMON_RPC}"),
        ("admin changelist rpc=rare", f"{cl}?rpc__exact={pop.RARE_RPC}"),
        ("admin changelist branch=feature", f"{cl}?branch={pop.BRANCH}"),
        ("admin changelist namespace=mid", f"{cl}?namespace={mid}"),
        (
            "admin changelist namespace=mid&author=busy",
            f"{cl}?namespace={mid}&author={pop.BUSY_AUTHOR}",
        ),
        ("admin changelist until=old day", until),
        ("admin search slug (busy)", f"{cl}?q={f['busy_slug']}"),
        ("admin search slug, page 2", page2),
        ("admin search ns/kind/slug", f"{cl}?q={ns}/item/obj-0"),
        ("admin search id", f"{cl}?q={f['id']}"),
        ("admin search #seq", f"{cl}?q=%23{f['mid_seq']}"),
        ("admin changeset detail", f"{cl}{f['id']}/change/"),
        ("admin revision changelist", f"{ADMIN}/revision/"),
        ("admin revision search slug", f"{ADMIN}/revision/?q={f['busy_slug']}"),
        ("admin entity history busy", f"{ADMIN}/revision/entity/{ns}/item/obj-0/"),
        ("admin journal", f"{ADMIN}/journalentry/"),
        ("admin deleted (trash) index", f"{ADMIN}/revision/deleted/"),
        ("admin deleted (trash) namespace=mid", f"{ADMIN}/revision/deleted/{mid}/"),
        ("admin erasures", f"{ADMIN}/erasure/"),
        ("admin entities", "/admin/entities/entity/"),
        ("admin entities search slug", "/admin/entities/entity/?q=obj-0"),
        ("admin branches", "/admin/branches/branch/"),
    ]


def child(args: argparse.Namespace) -> None:
    """``--serve <size>``: populate if needed, then serve this size's pages in-process to
    the parent (bench/_scale_measure.py), on the protocol stream."""
    claim_stdout()  # the protocol's; populating prints
    from django.conf import settings
    from django.test import Client

    name = scale_database(args.serve)
    setup(database=name)
    populate(args.serve, name)
    who = users()
    f = facts()
    clients, headers = {}, {}
    for user_name, (user, token) in who.items():
        client = Client()
        client.force_login(user)
        clients[user_name] = (client, {"HTTP_AUTHORIZATION": f"Token {token}"})
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        headers[user_name] = {
            "api": {"Authorization": f"Token {token}"},
            "admin": {"Cookie": f"{settings.SESSION_COOKIE_NAME}={session}"},
        }
    listed = [(u, page, url) for u in who for page, url in pages(f, u, args.offset_urls)]

    def get(user: str, url: str) -> Any:
        client, token = clients[user]
        return client.get(url, **(token if url.startswith(API) else {}))

    hello = {"pages": listed, "headers": headers, "facts": f, "database_url": database_url(name)}
    serve({(u, p): url for u, p, url in listed}, get, hello)


def measure(args: argparse.Namespace, sizes: list[str]) -> None:
    """Every page at every size, interleaved, in-process and (unless ``--no-http``) over
    gunicorn; saved per size as ``scale-<size>-<label>.json`` for ``--report``."""
    servers: list[SizeServer] = []
    try:
        for size in sizes:  # one at a time: a population runs alone
            argv = [sys.executable, __file__, "--serve", size]
            servers.append(SizeServer(size, argv + (["--offset-urls"] if args.offset_urls else [])))
        keys = [k for k in servers[0].urls if not args.only or args.only in k[1]]
        results = in_process(servers, keys, args.runs, seconds=args.seconds)
        if not args.no_http:
            for size, timings in over_http(servers, keys, args.runs, seconds=args.seconds).items():
                for key, timing in timings.items():
                    results[size][key].update(timing)
    finally:
        for s in servers:
            s.close()
    for key in keys:
        cells = [results[size][key] for size in sizes]
        print(
            f"{key[0]:9} {key[1]:44} "
            + "  ".join(
                f"{c['p50']:6.1f}/{c.get('http_p50', float('nan')):6.1f} sql {c['sql_ms']:5.2f}"
                f" rd {c['buffers_read']:4.0f}"
                for c in cells
            ),
            flush=True,
        )
    for size in sizes:
        out = plots_dir() / f"scale-{size}-{args.label}.json"
        data = {
            "size": SIZES[size],
            "facts": next(s.facts for s in servers if s.size == size),
            "method": 2,
            "interleaved_with": [SIZES[s] for s in sizes],
            "results": list(results[size].values()),
        }
        out.write_text(json.dumps(data, indent=1))
        print(f"saved {out}")
    if not args.no_report:
        report()  # the section, plot and plans from every saved run


def populate(size: str, name: str) -> None:
    """Populate ``name`` with ``size`` changesets unless it holds a log already."""
    from django.db import connection, transaction

    from changesets.selectors.log import log_head

    head = log_head()
    if head is not None and head.seq:
        return
    print(f"populating {SIZES[size]:,} changesets into {name} ...", flush=True)
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        steps = pop.populate(cursor, SIZES[size])
    vac = pop.vacuum(database_url(name))
    total = time.perf_counter() - started
    print(f"populated in {total:.0f} s (vacuum {vac:.0f} s)", flush=True)
    record = plots_dir() / f"scale-populate-{size}.txt"
    record.write_text(
        json.dumps({"seconds": total, "vacuum": vac, "steps": steps}, indent=1) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100k,1m,10m", help="comma-separated, interleaved")
    parser.add_argument("--size", choices=SIZES, help="one size (same as --sizes SIZE)")
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--label", default="warm")
    parser.add_argument(
        "--seconds",
        type=float,
        default=60,
        help="a page whose rounds (all sizes) took this long stops at three rounds",
    )
    parser.add_argument("--only", help="time only pages whose label contains this")
    parser.add_argument("--populate-only", action="store_true")
    parser.add_argument(
        "--offset-urls", action="store_true", help="the pre-issue-18 URLs (?p=, date hierarchy)"
    )
    parser.add_argument("--no-http", action="store_true", help="in-process only")
    parser.add_argument("--report", action="store_true", help="only write the report")
    parser.add_argument("--no-report", action="store_true", help="measure, save, no report")
    parser.add_argument("--serve", choices=SIZES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    bench_env()
    if args.report:
        report()
        return
    if args.serve:
        child(args)
        return
    sizes = [args.size] if args.size else args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}: {', '.join(SIZES)}")
    if args.populate_only:
        if len(sizes) > 1:  # one process per database (Django binds one)
            for size in sizes:
                argv = [sys.executable, __file__, "--size", size, "--populate-only"]
                subprocess.run(argv, check=True)
            return
        setup(database=scale_database(sizes[0]))
        populate(sizes[0], scale_database(sizes[0]))
        return
    measure(args, sizes)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    main()
