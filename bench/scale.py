"""Every page at 100k, 1M (and 10M) changesets (issue 18): API lists and admin pages.

    .venv/bin/python bench/scale.py --size 100k [--runs 5] [--label after]
    .venv/bin/python bench/scale.py --report      # the docs section and plot from saved runs

Each size has its own database on the benchmark server (``atlas_scale_100k``,
``atlas_scale_1m``, ``atlas_scale_10m``), populated once by server-side SQL
(``bench/scale_populate.py`` says what the log looks like and why it bypasses
the write service) and reused by later runs. Then every API list filter and
every admin page is requested as a superuser (``root``) and as a staff user who
reads two namespaces (``rita``: a 3% one and a 0.02% one), ``--runs`` times
after one warm-up; the p50 is kept. Requests go through Django's test client
in this process (the whole middleware, auth, view and template stack, no
socket): the pages are single requests, and a client in-process measures
what the server does for one, not the network. Each page's slowest statement
is re-run under ``EXPLAIN (ANALYZE, BUFFERS)`` and saved with the timings in
``docs/benchmarks/scale-<size>-<label>.json``; ``--report`` writes the section
of ``docs/benchmarks.md`` and ``docs/benchmarks/scale.png`` from those files.

The machine is shared (2 cores, several engineers): the milliseconds are
indicative, the plans are the evidence.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import scale_populate as pop
from _common import bench_env, plots_dir
from _setup import ROOT, database_url, setup, write_section

SIZES = {"100k": 100_000, "1m": 1_000_000, "10m": 10_000_000}
TARGET_MS = 100.0
TITLE = "Every page at 100k, 1M (and 10M) changesets (issue 18)"
ADMIN = "/admin/changesets"
API = "/api/v1"


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
            ]
        )
    )
    return {
        "superuser": (root, api_token_create(user=root, name="scale")[1]),
        "scoped": (rita, api_token_create(user=rita, name="scale")[1]),
    }


def facts() -> dict[str, Any]:
    """Values the page list needs: an old time and seq, a changeset id, a busy key."""
    from changesets.models import Changeset, Revision

    newest = Changeset.objects.order_by("-seq").first()
    assert newest is not None
    total = newest.seq
    old = Changeset.objects.get(seq=max(total // 50, 1))  # 98% back
    busy = (
        Revision.objects.filter(branch="", namespace=pop.BUSY_NS, slug="obj-0")
        .order_by("-seq")
        .first()
    )
    mid = Changeset.objects.filter(namespaces__contains=[pop.MID_NS]).order_by("-seq").first()
    return {
        "total": total,
        "old_seq": old.seq,
        "old_at": old.at.isoformat().replace("+00:00", "Z"),
        "old_day": old.at.date().isoformat(),
        "page2000_seq": max(total - 2000 * 50, total // 100),
        "id": str(mid.id if mid else newest.id),
        "mid_seq": mid.seq if mid else newest.seq,
        "busy_slug": "obj-0",
        "busy_seq": busy.seq if busy else total,
    }


def pages(f: dict[str, Any], user: str, offset: bool) -> list[tuple[str, str]]:
    """(label, url) of every page timed, as ``user`` asks it.

    The scoped user asks the same URLs, except that her busy entity is in the
    namespace she reads. ``offset``: the URLs of the code before issue 18
    (``?p=`` pages, the date hierarchy) for the pages whose URL changed.
    """
    mid, rare = pop.MID_NS, pop.RARE_NS
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
        ("api changes feed", f"{API}/changes?limit=100"),
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
        ("admin entities", "/admin/entities/entity/"),
        ("admin entities search slug", "/admin/entities/entity/?q=obj-0"),
        ("admin branches", "/admin/branches/branch/"),
    ]


def explain_slowest(queries: list[dict[str, Any]]) -> tuple[float, str]:
    """The slowest captured statement's time and its EXPLAIN (ANALYZE, BUFFERS)."""
    from django.db import connection

    if not queries:
        return 0.0, ""
    slow = max(queries, key=lambda q: float(q["time"]))
    sql = slow["sql"]
    if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
        return float(slow["time"]) * 1000, sql
    try:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql)
            plan = "\n".join(r[0] for r in cursor.fetchall())
    except Exception as exc:  # noqa: BLE001 - raw SQL logged without its parameters
        plan = f"(not re-run: {type(exc).__name__})\n{sql}"
    return float(slow["time"]) * 1000, plan


def measure(size: str, runs: int, label: str, only: str | None, offset: bool) -> Path:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    who = users()
    f = facts()
    results: list[dict[str, Any]] = []
    for name, (user, token) in who.items():
        client = Client()
        client.force_login(user)
        for page, url in pages(f, name, offset):
            if only and only not in page:
                continue
            headers = {"HTTP_AUTHORIZATION": f"Token {token}"} if url.startswith(API) else {}
            status = client.get(url, **headers).status_code  # warm-up
            samples = []
            for _ in range(runs):
                started = time.perf_counter()
                client.get(url, **headers)
                samples.append((time.perf_counter() - started) * 1000)
            with CaptureQueriesContext(connection) as captured:
                client.get(url, **headers)
            slow_ms, plan = explain_slowest(captured.captured_queries)
            p50 = statistics.median(samples)
            results.append(
                {
                    "page": page,
                    "user": name,
                    "url": url,
                    "status": status,
                    "p50": p50,
                    "queries": len(captured.captured_queries),
                    "sql_ms": sum(float(q["time"]) for q in captured.captured_queries) * 1000,
                    "slowest_query_ms": slow_ms,
                    "plan": plan if len(plan) <= 4000 else plan[:4000] + "\n… (truncated)",
                }
            )
            flag = "" if p50 <= TARGET_MS else "  <-- over"
            print(f"{name:9} {page:42} {status} {p50:8.1f} ms{flag}", flush=True)
    out = plots_dir() / f"scale-{size}-{label}.json"
    out.write_text(json.dumps({"size": SIZES[size], "facts": f, "results": results}, indent=1))
    print(f"saved {out}")
    return out


def report() -> None:
    """The docs section (tables per label and size) and the p50-vs-size plot."""
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(plots_dir().glob("scale-*.json")):
        data = json.loads(path.read_text())
        label = path.stem.split("-", 2)[2]
        runs.setdefault(label, {})[data["size"]] = data
    notes = Path(ROOT / "bench" / "scale_notes.md").read_text().rstrip() + "\n"
    times = []
    for size in SIZES:
        path = plots_dir() / f"scale-populate-{size}.txt"
        if path.exists():
            took = json.loads(path.read_text())
            seconds, vacuum = took["seconds"], took["vacuum"]
            times.append(f"{seconds:.0f} s at {SIZES[size]:,} (VACUUM {vacuum:.0f} s)")
    notes = notes.replace("POPULATE_TIMES", ", ".join(times) or "(not recorded)")
    cost = plots_dir() / "scale-write-cost.md"
    notes = notes.replace("WRITE_COST", cost.read_text() if cost.exists() else "(not measured)")
    body = [notes]
    for label in sorted(runs, key=lambda x: (x != "before", x)):
        sizes = sorted(runs[label])
        cells = {(r["page"], r["user"]): {} for s in sizes for r in runs[label][s]["results"]}
        for s in sizes:
            for r in runs[label][s]["results"]:
                cells[(r["page"], r["user"])][s] = r
        head = " | ".join(f"p50 ms at {s:,}" for s in sizes)
        sql_head = " | ".join(f"SQL ms at {s:,}" for s in sizes)
        body.append(f"\n### {label}\n\n| page | user | {head} | ratio | {sql_head} | queries |")
        body.append("|---|---|" + "---|" * (2 * len(sizes)) + "---|---|")
        for (page, user), by_size in cells.items():
            vals = [by_size.get(s) for s in sizes]
            shown = [f"{v['p50']:.1f}" if v else "—" for v in vals]
            shown = [
                f"**{t}**" if v and (v["p50"] > TARGET_MS or v["status"] >= 400) else t
                for t, v in zip(shown, vals, strict=True)
            ]
            ratio = (
                f"{vals[-1]['p50'] / vals[0]['p50']:.2f}"
                if len(sizes) > 1 and vals[0] and vals[-1]
                else "—"
            )
            queries = vals[-1]["queries"] if vals[-1] else "—"
            sql = [f"{v['sql_ms']:.1f}" if v and "sql_ms" in v else "—" for v in vals]
            body.append(
                f"| {page} | {user} | {' | '.join(shown)} | {ratio} | {' | '.join(sql)}"
                f" | {queries} |"
            )
    write_section(TITLE, "\n".join(body))
    plot(runs)
    plans(runs)


def plot(runs: dict[str, dict[int, dict[str, Any]]]) -> None:
    """p50 vs log size per user: every page after (grey), and the worst and median
    page before and after issue 18."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5), sharey=True)
    for ax, user in zip(axes, ("superuser", "scoped"), strict=True):
        for label, style in (("before", "--"), ("after", "-")):
            if label not in runs:
                continue
            sizes = sorted(runs[label])
            by_page: dict[str, dict[int, float]] = {}
            for size in sizes:
                for r in runs[label][size]["results"]:
                    if r["user"] == user and r["status"] < 400:
                        by_page.setdefault(r["page"], {})[size] = r["p50"]
            if label == "after":
                for points in by_page.values():
                    xs = sorted(points)
                    ax.plot(xs, [points[x] for x in xs], color="0.8", linewidth=0.7)
            worst = [max(p[s] for p in by_page.values() if s in p) for s in sizes]
            median = [statistics.median(p[s] for p in by_page.values() if s in p) for s in sizes]
            lines = ((worst, "tab:red", "worst"), (median, "tab:blue", "median"))
            for values, color, what in lines:
                name = f"{what} page, {label}"
                ax.plot(sizes, values, style, marker="o", color=color, label=name)
        ax.axhline(TARGET_MS, color="black", linestyle=":", linewidth=1, label="target 100 ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("changesets in the log")
        ax.set_title(f"every page, {user} (grey: each page after)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("p50 ms (in-process client)")
    fig.tight_layout()
    fig.savefig(plots_dir() / "scale.png", dpi=100)


def plans(runs: dict[str, dict[int, dict[str, Any]]]) -> None:
    """docs/benchmarks/scale-plans.md: each page's slowest statement at the largest size."""
    out = ["# Scale benchmark: the slowest statement of each page (EXPLAIN ANALYZE)\n"]
    for label in sorted(runs, key=lambda x: (x != "before", x)):
        size = max(runs[label])
        out.append(f"\n## {label}, {size:,} changesets\n")
        out.append("(Each page's slowest statement as Django recorded it, re-run under EXPLAIN.)")
        for r in runs[label][size]["results"]:
            out.append(
                f"\n### {r['page']} ({r['user']}): p50 {r['p50']:.1f} ms,"
                f" {r['queries']} statements, slowest {r['slowest_query_ms']:.1f} ms\n"
            )
            out.append("```\n" + r["plan"].strip() + "\n```")
    (plots_dir() / "scale-plans.md").write_text("\n".join(out) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=SIZES)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="after")
    parser.add_argument("--only", help="time only pages whose label contains this")
    parser.add_argument("--populate-only", action="store_true")
    parser.add_argument(
        "--offset-urls", action="store_true", help="the pre-issue-18 URLs (?p=, date hierarchy)"
    )
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    bench_env()
    if args.report:
        report()
        return
    if not args.size:
        parser.error("--size or --report")
    name = f"atlas_scale_{args.size}"
    setup(database=name)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM changesets_changeset")
        empty = cursor.fetchone()[0] == 0
    if empty:
        print(f"populating {SIZES[args.size]:,} changesets into {name} ...", flush=True)
        started = time.perf_counter()
        from django.db import transaction

        with transaction.atomic(), connection.cursor() as cursor:
            steps = pop.populate(cursor, SIZES[args.size])
        vac = pop.vacuum(database_url(name))
        total = time.perf_counter() - started
        print(f"populated in {total:.0f} s (vacuum {vac:.0f} s)", flush=True)
        record = plots_dir() / f"scale-populate-{args.size}.txt"
        record.write_text(
            json.dumps({"seconds": total, "vacuum": vac, "steps": steps}, indent=1) + "\n"
        )
    if args.populate_only:
        return
    measure(args.size, args.runs, args.label, args.only, args.offset_urls)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    main()
