"""As-of pages at depth 10, 10k and 500k vs the current page: Atlas and django-simple-history.

    .venv/bin/python bench/asof_vs_peers.py [--smoke] [--json PATH]

Atlas: bench/asof.py's population (namespace ``bench.asof``: 10,000 entities,
101 revisions each, two revisions per changeset; made once and reused), read
through ``entities_as_of`` like bench/asof.py does. django-simple-history: the
same history, row for row, on the same timeline (``history_date`` = the time of
the Atlas changeset that made the revision), written with set-based SQL into
its historical table, and read with ``SHItem.history.as_of(date)`` (its
documented way to see the whole table at a time). A page = 500 entities of the
namespace in slug order. Target (Atlas): every depth ≤ 2× the current page.
"""

from __future__ import annotations

import time

from _common import (
    bench_env,
    database,
    header,
    image,
    interleaved_ms,
    parse_part_args,
    part_parser,
    peers_available,
    plot,
    repeat_ms,
    summary,
    table,
    write_json,
)
from _setup import setup, write_section

NS = "bench.asof"
SH_TIMEOUT_MS = 60_000


def populate_sh(cursor, entities: int, updates: int, payload: str) -> float:
    """django-simple-history's tables with the same history as asof.populate wrote."""
    started = time.perf_counter()
    total = entities * (updates + 1)
    cursor.execute(
        """
        INSERT INTO bench_peers_shitem (id, namespace, slug, content)
        SELECT 1000000000 + e, %(ns)s, 'e' || lpad(e::text, 6, '0'),
               jsonb_build_object('v', %(u)s, 'payload', %(p)s)
        FROM generate_series(0, %(e)s - 1) AS e
        """,
        {"ns": NS, "e": entities, "u": updates, "p": payload},
    )
    cursor.execute(
        """
        INSERT INTO bench_peers_historicalshitem
            (id, namespace, slug, content, history_date, history_change_reason,
             history_type, history_user_id)
        SELECT 1000000000 + r %% %(e)s, %(ns)s, 'e' || lpad((r %% %(e)s)::text, 6, '0'),
               jsonb_build_object('v', r / %(e)s, 'payload', %(p)s),
               to_timestamp((1700000000000 + r / 2 + 1) / 1000.0), NULL,
               CASE WHEN r < %(e)s THEN '+' ELSE '~' END, NULL
        FROM generate_series(0, %(total)s - 1) AS r
        """,
        {"ns": NS, "e": entities, "total": total, "p": payload},
    )
    cursor.execute("ANALYZE bench_peers_historicalshitem")
    cursor.execute("ANALYZE bench_peers_shitem")
    return time.perf_counter() - started


def main() -> None:
    parser = part_parser(__doc__, doc_option=False)
    parser.add_argument("--repeat", type=int, default=25)
    parser.add_argument("--page", type=int, default=500)
    args = parse_part_args(parser)
    bench_env()
    setup(settings="bench.settings", database=database(args.smoke))
    import asof as atlas_asof  # bench/asof.py: its population and namespace
    from django.db import connection, transaction

    from changesets.models import Changeset, Revision
    from changesets.selectors.asof import entities_as_of
    from entities.models import Namespace
    from entities.store import baseline

    smoke = args.smoke
    entities, updates = (200, 10) if smoke else (10_000, 100)
    depths = [10, 100, 500] if smoke else [10, 10_000, 500_000]
    repeat = 3 if smoke else args.repeat
    page = 50 if smoke else args.page
    peers = peers_available()
    populated = {}
    if not Namespace.objects.filter(name=NS).exists():
        started = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            atlas_asof.populate(cursor, entities, updates)
        populated["Atlas"] = time.perf_counter() - started
    revisions = Revision.objects.filter(namespace=NS).count()
    first = Changeset.objects.filter(namespaces__contains=[NS]).order_by("seq").first().seq
    head = Changeset.objects.filter(namespaces__contains=[NS]).order_by("-seq").first().seq

    if peers:
        from bench.peers.models import SHItem

        if not SHItem.objects.filter(namespace=NS).exists():
            with transaction.atomic(), connection.cursor() as cursor:
                populated["django-simple-history"] = populate_sh(
                    cursor, entities, updates, atlas_asof.PAYLOAD
                )
        sh_rows = SHItem.history.filter(namespace=NS).count()

    def atlas_current() -> None:
        assert len(baseline.list(namespaces=None, namespace=NS, limit=page)) == page

    rows: dict[str, dict[str, dict]] = {"Atlas": {}, "django-simple-history": {}}
    # Atlas's current page and its as-of pages run in interleaved rounds (each round
    # reads every page once), so a load spike from whatever shares the machine hits
    # the current page and the as-of pages alike: the ratios are what is judged.
    atlas_reads: dict = {"current": atlas_current}
    for depth in depths:
        if head - depth >= first:

            def atlas_page(seq: int = head - depth) -> None:
                got = entities_as_of(seq=seq, namespaces=None, namespace=NS, limit=page)
                assert len(got) == page, len(got)

            atlas_reads[depth] = atlas_page
    for key, samples in interleaved_ms(atlas_reads, repeat, seconds=180).items():
        rows["Atlas"][key] = summary(samples)
    sh_current = None
    if peers:

        def sh_current_fn() -> None:
            got = list(SHItem.objects.filter(namespace=NS).order_by("slug")[:page])
            assert len(got) == page

        sh_current = summary(repeat_ms(sh_current_fn, repeat, seconds=60))
        rows["django-simple-history"]["current"] = sh_current

    plan = ""
    for depth in depths:
        seq = head - depth
        if seq < first:
            continue
        target = Changeset.objects.get(seq=seq)
        if not peers:
            continue

        def sh_page(at=target.at) -> None:
            qs = SHItem.history.as_of(at).filter(namespace=NS).order_by("slug")[:page]
            got = list(qs)
            assert len(got) == page, len(got)

        with connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {SH_TIMEOUT_MS}")
        try:
            # django-simple-history is slow here; fewer repeats keep the run in budget.
            sh_samples = repeat_ms(sh_page, max(3, repeat // 5), seconds=90)
            rows["django-simple-history"][depth] = summary(sh_samples)
        except Exception as exc:  # noqa: BLE001 - a timeout is a result
            rows["django-simple-history"][depth] = {"error": type(exc).__name__}
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET statement_timeout = 0")
        if depth == depths[-1]:
            qs = SHItem.history.as_of(target.at).filter(namespace=NS).order_by("slug")[:page]
            sql, params = qs.query.sql_with_params()
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params)
                plan = "\n".join(r[0] for r in cursor.fetchall())

    def p50(impl: str, key) -> float:
        return rows[impl].get(key, {}).get("p50", float("nan"))

    out_rows = []
    for key in ["current", *depths]:
        label = "current page" if key == "current" else f"as of {key:,} changesets back"
        line = [label, p50("Atlas", key), f"{p50('Atlas', key) / p50('Atlas', 'current'):.2f}×"]
        if peers:
            sh = rows["django-simple-history"].get(key, {})
            if "error" in sh:
                line += [f"> {SH_TIMEOUT_MS / 1000:.0f} s ({sh['error']})", "–"]
            else:
                line += [sh.get("p50", float("nan")), f"{sh['p50'] / sh_current['p50']:.2f}×"]
            line.append(f"{sh.get('p50', float('nan')) / p50('Atlas', key):.1f}×")
        out_rows.append(line)
    xs = [d for d in depths if d in rows["Atlas"]]
    series = {
        "Atlas as-of page": (xs, [p50("Atlas", d) for d in xs]),
        "Atlas current page": (xs, [p50("Atlas", "current")] * len(xs)),
    }
    if peers:
        ok = [d for d in xs if "p50" in rows["django-simple-history"].get(d, {})]
        series["django-simple-history as_of()"] = (
            ok,
            [rows["django-simple-history"][d]["p50"] for d in ok],
        )
        series["django-simple-history current page"] = (xs, [sh_current["p50"]] * len(xs))
    plot(
        "asof_vs_depth.png",
        series,
        title=f"As-of page of {page} entities vs depth",
        xlabel="changesets back from the head",
        ylabel="ms (median)",
        logx=True,
        logy=True,
    )
    headers = ["read", "Atlas p50 ms", "Atlas × current"]
    if peers:
        headers += [
            "simple-history p50 ms",
            "simple-history × its current",
            "simple-history ÷ Atlas",
        ]
    cmd = ".venv/bin/python bench/asof_vs_peers.py" + (" --smoke" if smoke else "")
    lines = [
        header(cmd),
        "",
        f"{revisions:,} Atlas revisions over {entities:,} entities in `{NS}`"
        + (
            f"; the same {sh_rows:,} rows in django-simple-history's historical table"
            if peers
            else ""
        )
        + f". Page of {page} entities in slug order; median of {repeat} runs for Atlas"
        f" (in-process, through the selectors) and of {max(3, repeat // 5)} for"
        " django-simple-history (`SHItem.history.as_of(at).filter(namespace=…)"
        f".order_by('slug')[:{page}]`, the `at` of the same changeset).",
        "",
        table(headers, out_rows),
        "",
        image("asof_vs_depth.png", "as-of page time vs depth"),
    ]
    if populated:
        lines += [
            "",
            "Populated this run: "
            + ", ".join(f"{k} in {v:.0f} s" for k, v in populated.items())
            + ".",
        ]
    if plan:
        lines += [
            "",
            f"EXPLAIN ANALYZE of django-simple-history's as_of page {depths[-1]:,} back:",
            "",
            "```",
            plan,
            "```",
        ]
    write_section("Against the peers 4. As-of pages vs depth", "\n".join(lines))
    write_json(args.json, {"rows": rows, "revisions": revisions, "populated": populated})


if __name__ == "__main__":
    main()
