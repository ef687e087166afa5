"""Writes against the peers: single-entity writes, batches, and the bytes each leaves behind.

    .venv/bin/python bench/writes_vs_peers.py [--smoke] [--json PATH] [--profile]

1. Single-entity write, each its own transaction, interleaved in rounds so that
   machine noise hits every implementation alike: Atlas through the service and
   through HTTP (in-process DRF client, token auth, a writer-role user), the plain
   model (get() + save()) and the same plain model behind a DRF update endpoint,
   raw psycopg (one prepared UPDATE), and each peer's own path.
2. Batches of 10 … 2,500 rows as one transaction: Atlas as one changeset, the
   plain save() loop (the baseline), Django's bulk_update, raw psycopg
   ``UPDATE … FROM unnest()``, and each peer's per-row path (plus its bulk path
   where it has one).
7. Storage: bytes each implementation's history tables grow by per single-entity write
   (``_bytes_growth``), without and with what a request records (Atlas's provenance;
   the peers' user, and django-pghistory's context row as its middleware writes it),
   and the average row bytes of each log table.

Records sections 1, 2 and 7 in docs/benchmarks.md and plots batch time vs size.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from _bytes_growth import TARGET, against_peers, growth_per_write
from _common import (
    bench_env,
    database,
    header,
    image,
    parse_part_args,
    part_parser,
    peers_available,
    plot,
    plots_dir,
    summary,
    table,
    timed_ms,
    write_json,
)
from _setup import setup, write_section

PAYLOAD = "x" * 100


def content(n: int) -> dict[str, Any]:
    return {"n": n, "payload": PAYLOAD, "tags": ["alpha", "beta"], "ok": True}


def main() -> None:
    parser = part_parser(__doc__, doc_option=False)
    parser.add_argument("--profile", action="store_true", help="pyinstrument the Atlas paths")
    parser.add_argument("--seconds", type=float, default=420, help="time budget")
    args = parse_part_args(parser)
    bench_env()
    setup(settings="bench.settings", database=database(args.smoke))
    started = time.monotonic()
    deadline = started + args.seconds

    import psycopg
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext
    from psycopg.types.json import Jsonb
    from rest_framework.test import APIClient

    from atlas.services import api_token_create
    from bench.plain.models import PlainItem
    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.services import role_grant
    from entities.store import EntityKey, baseline
    from tests.entities.factories import SuperuserFactory, UserFactory

    peers = peers_available()
    smoke = args.smoke
    rid = uuid.uuid4().hex[:8]
    counter = iter(range(10**9))

    root = SuperuserFactory(username="bench-root")
    writer = UserFactory(username="bench-writer")
    token_key = api_token_create(user=writer, name="bench")[1]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_key}")
    raw = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)

    tables = ["bench_plain_plainitem"]
    if peers:
        tables += [
            "bench_peers_rvitem",
            "reversion_version",
            "reversion_revision",
            "bench_peers_pghitem",
            "bench_peers_pghitemevent",
        ]
    with connection.cursor() as cursor:  # throw-away rows of earlier runs
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
        if peers:  # keeping asof_vs_peers.py's population (namespace bench.asof)
            for relation in ("bench_peers_historicalshitem", "bench_peers_shitem"):
                cursor.execute(f"DELETE FROM {relation} WHERE namespace <> 'bench.asof'")

    atlas_namespaces: list[str] = []

    def atlas_ns(tag: str) -> str:
        name = f"bench.{tag}{rid}"
        ns = Namespace.objects.create(name=name)
        role_grant(namespace=ns, principal=writer, role="writer")
        atlas_namespaces.append(name)
        return name

    models: dict[str, Any] = {"plain": PlainItem}
    if peers:
        import reversion

        from bench.peers.models import PGHItem, RVItem, SHItem

        models.update({"sh": SHItem, "rv": RVItem, "pgh": PGHItem})

    def create_rows(model: Any, ns: str, n: int) -> None:
        if model is None:
            return
        # Setup only (not timed): the rows the measured writes then update.
        objs = [model(namespace=ns, slug=f"k{i:05d}", content=content(0)) for i in range(n)]
        model.objects.bulk_create(objs)

    def create_atlas(ns: str, n: int) -> None:
        for start in range(0, n, 1000):
            ops = [
                PutOp(EntityKey(ns, "item", f"k{i:05d}"), content(0))
                for i in range(start, min(n, start + 1000))
            ]
            changeset_apply(store=baseline, actor=root, ops=ops, rpc=Rpc.BATCH_MUTATE)

    # --- 1. single-entity writes ---------------------------------------------------------
    keys = 5 if smoke else 50
    single_ns = atlas_ns("s")
    create_atlas(single_ns, keys)
    pns = f"s-{rid}"
    for model in models.values():
        create_rows(model, pns, keys)
    raw_ns = f"raw-{rid}"
    PlainItem.objects.bulk_create(
        [PlainItem(namespace=raw_ns, slug=f"k{i:05d}", content=content(0)) for i in range(keys)]
    )
    plain_http_ns = f"h-{rid}"
    PlainItem.objects.bulk_create(
        [
            PlainItem(namespace=plain_http_ns, slug=f"k{i:05d}", content=content(0))
            for i in range(keys)
        ]
    )

    def slug(i: int) -> str:
        return f"k{i % keys:05d}"

    def orm_write(model: Any) -> Callable[[int], None]:
        def write(i: int) -> None:
            with transaction.atomic():
                obj = model.objects.get(namespace=pns, slug=slug(i))
                obj.content = content(next(counter))
                obj.save()

        return write

    writer_names = [f.attname for f in type(writer)._meta.concrete_fields]
    writer_row = [getattr(writer, n) for n in writer_names]

    def fresh_writer() -> Any:
        """The writer as token auth hands it to a view: a new object, no roles on it.

        Built from the row already read (no query): the token lookup is left out,
        as plain get()+save() and the peers authenticate nobody; the HTTP row pays it.
        """
        return type(writer).from_db("default", writer_names, writer_row)

    def atlas_put(actor: Any, i: int) -> None:
        key = EntityKey(single_ns, "item", slug(i))
        changeset_apply(
            store=baseline,
            actor=actor,
            ops=[PutOp(key, content(next(counter)))],
            rpc=Rpc.PUT_ENTITY,
        )

    def atlas_service(i: int) -> None:
        atlas_put(fresh_writer(), i)

    known_writer = fresh_writer()  # its roles load on the first write and stay cached on it

    def atlas_roles_cached(i: int) -> None:
        atlas_put(known_writer, i)

    def atlas_superuser(i: int) -> None:
        atlas_put(root, i)

    def atlas_http(i: int) -> None:
        response = client.put(
            f"/api/v1/entities/{single_ns}/item/{slug(i)}",
            {"content": content(next(counter))},
            format="json",
        )
        assert response.status_code == 200, response.content[:300]

    def plain_http(i: int) -> None:
        response = client.put(
            f"/bench/plain/{plain_http_ns}/{slug(i)}",
            {"content": content(next(counter))},
            format="json",
        )
        assert response.status_code == 200, response.content[:300]

    raw_sql = "UPDATE bench_plain_plainitem SET content = %s WHERE namespace = %s AND slug = %s"

    def raw_write(i: int) -> None:
        raw.execute(raw_sql, [Jsonb(content(next(counter))), raw_ns, slug(i)], prepare=True)

    singles: dict[str, Callable[[int], None]] = {
        "plain get()+save()": orm_write(PlainItem),
        "raw psycopg prepared UPDATE": raw_write,
        "Atlas service": atlas_service,
        "Atlas service, roles known (cached on the writer object)": atlas_roles_cached,
        "Atlas service, roles known (superuser: the figure before issue 17)": atlas_superuser,
    }
    if peers:

        def rv_write(i: int) -> None:
            with reversion.create_revision():
                obj = models["rv"].objects.get(namespace=pns, slug=slug(i))
                obj.content = content(next(counter))
                obj.save()

        singles["django-simple-history"] = orm_write(models["sh"])
        singles["django-reversion"] = rv_write
        singles["django-pghistory"] = orm_write(models["pgh"])
    singles["plain DRF endpoint (in-process HTTP)"] = plain_http
    singles["Atlas PUT (in-process HTTP)"] = atlas_http

    rounds, per_round = (2, 3) if smoke else (12, 25)
    samples: dict[str, list[float]] = {name: [] for name in singles}
    for fn in singles.values():  # warm up: connections, caches, prepared statements
        for i in range(3):
            fn(i)
    names = list(singles)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn = singles[name]
            for _ in range(per_round):
                samples[name].append(timed_ms(lambda fn=fn: fn(next(counter)))[0])
        if time.monotonic() > deadline - args.seconds * 0.6:
            break  # keep most of the budget for the batches

    single_queries: dict[str, int] = {}
    for name, fn in singles.items():
        if name.startswith("raw"):
            single_queries[name] = 1
            continue
        with CaptureQueriesContext(connection) as ctx:
            fn(next(counter))
        single_queries[name] = len(ctx.captured_queries)

    plain_p50 = summary(samples["plain get()+save()"])["p50"]
    single_rows = []
    single_result = {}
    for name in singles:
        s = summary(samples[name])
        single_result[name] = {**s, "ratio": s["p50"] / plain_p50, "queries": single_queries[name]}
        single_rows.append(
            [name, s["p50"], s["p95"], f"{s['p50'] / plain_p50:.2f}×", single_queries[name], s["n"]]
        )

    # --- 2. batches -----------------------------------------------------------------------
    sizes = [10, 50] if smoke else [10, 100, 1000, 2500]
    batch_rounds = {10: 5, 50: 1, 100: 5, 1000: 5, 2500: 3}
    if smoke:
        batch_rounds = dict.fromkeys(sizes, 1)

    def orm_loop(model: Any, ns: str) -> Callable[[int], int]:
        def run(n: int) -> int:
            with transaction.atomic():
                objs = list(model.objects.filter(namespace=ns).order_by("slug"))
                for obj in objs:
                    obj.content = content(n)
                    obj.save()
            return len(objs)

        return run

    def orm_bulk(model: Any, ns: str) -> Callable[[int], int]:
        def run(n: int) -> int:
            with transaction.atomic():
                objs = list(model.objects.filter(namespace=ns).order_by("slug"))
                for obj in objs:
                    obj.content = content(n)
                model.objects.bulk_update(objs, ["content"])
            return len(objs)

        return run

    def sh_bulk(ns: str) -> Callable[[int], int]:
        from simple_history.utils import bulk_update_with_history

        def run(n: int) -> int:
            with transaction.atomic():
                objs = list(models["sh"].objects.filter(namespace=ns).order_by("slug"))
                for obj in objs:
                    obj.content = content(n)
                bulk_update_with_history(objs, models["sh"], ["content"])
            return len(objs)

        return run

    def rv_loop(ns: str) -> Callable[[int], int]:
        def run(n: int) -> int:
            with reversion.create_revision():
                objs = list(models["rv"].objects.filter(namespace=ns).order_by("slug"))
                for obj in objs:
                    obj.content = content(n)
                    obj.save()
            return len(objs)

        return run

    def atlas_batch(ns: str, size: int) -> Callable[[int], int]:
        def run(n: int) -> int:
            ops = [PutOp(EntityKey(ns, "item", f"k{i:05d}"), content(n)) for i in range(size)]
            result = changeset_apply(store=baseline, actor=root, ops=ops, rpc=Rpc.BATCH_MUTATE)
            return result.changeset.op_count

        return run

    raw_batch_sql = (
        "UPDATE bench_plain_plainitem p SET content = u.c"
        " FROM unnest(%s::text[], %s::jsonb[]) AS u(slug, c)"
        " WHERE p.namespace = %s AND p.slug = u.slug"
    )

    def raw_batch(ns: str, size: int) -> Callable[[int], int]:
        slugs = [f"k{i:05d}" for i in range(size)]

        def run(n: int) -> int:
            cur = raw.execute(raw_batch_sql, [slugs, [Jsonb(content(n))] * size, ns])
            return cur.rowcount

        return run

    batch_times: dict[str, dict[int, list[float]]] = {}
    batch_queries: dict[str, dict[int, int]] = {}
    bytes_size = 1000 if 1000 in sizes else sizes[-1]  # part 7's batch, per op
    bytes_batches: dict[str, Callable[[int], int]] = {}
    for size in sizes:
        impls: dict[str, Callable[[int], int]] = {}
        plain_ns, bulk_ns, raw_b_ns = f"b{size}-{rid}", f"bu{size}-{rid}", f"rb{size}-{rid}"
        for ns in (plain_ns, bulk_ns, raw_b_ns):
            create_rows(PlainItem, ns, size)
        impls["plain save() loop"] = orm_loop(PlainItem, plain_ns)
        impls["plain bulk_update()"] = orm_bulk(PlainItem, bulk_ns)
        impls["raw psycopg UPDATE … FROM unnest()"] = raw_batch(raw_b_ns, size)
        a_ns = atlas_ns(f"b{size}x")
        create_atlas(a_ns, size)
        impls["Atlas service (one changeset)"] = atlas_batch(a_ns, size)
        if peers:
            for tag, model in (("sh", models["sh"]), ("rv", models["rv"]), ("pgh", models["pgh"])):
                create_rows(model, f"{tag}{size}-{rid}", size)
            create_rows(models["sh"], f"shb{size}-{rid}", size)
            create_rows(models["pgh"], f"pghb{size}-{rid}", size)
            impls["django-simple-history save() loop"] = orm_loop(models["sh"], f"sh{size}-{rid}")
            impls["django-reversion save() loop"] = rv_loop(f"rv{size}-{rid}")
            impls["django-pghistory save() loop"] = orm_loop(models["pgh"], f"pgh{size}-{rid}")
            impls["django-simple-history bulk_update_with_history()"] = sh_bulk(f"shb{size}-{rid}")
            impls["django-pghistory bulk_update() (triggers)"] = orm_bulk(
                models["pgh"], f"pghb{size}-{rid}"
            )
        if size == bytes_size:
            bytes_batches = dict(impls)
        names = list(impls)
        for name in names:  # warm, and count queries once
            with CaptureQueriesContext(connection) as ctx:
                done = impls[name](next(counter))
            assert done == size, (name, done, size)
            batch_queries.setdefault(name, {})[size] = (
                1 if name.startswith("raw") else len(ctx.captured_queries)
            )
        for r in range(batch_rounds[size]):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                fn = impls[name]
                ms, _ = timed_ms(lambda fn=fn: fn(next(counter)))
                batch_times.setdefault(name, {}).setdefault(size, []).append(ms)
            if time.monotonic() > deadline:
                break

    head_size = 1000 if 1000 in sizes else sizes[-1]
    base = summary(batch_times["plain save() loop"][head_size])["p50"]
    batch_rows = []
    batch_result: dict[str, Any] = {"size": head_size, "impls": {}}
    for name in batch_times:
        s = summary(batch_times[name].get(head_size, []))
        q = batch_queries[name].get(head_size, 0)
        batch_result["impls"][name] = {**s, "ratio": s["p50"] / base, "queries": q}
        batch_rows.append([name, s["p50"], s["min"], f"{s['p50'] / base:.2f}×", q, s["n"]])
    curve = {
        name: (
            sorted(by_size),
            [summary(by_size[size])["p50"] for size in sorted(by_size)],
        )
        for name, by_size in batch_times.items()
    }
    plot(
        "batch_time_vs_size.png",
        curve,
        title="Batch as one transaction: median time vs rows",
        xlabel="rows in the batch",
        ylabel="ms (median)",
        logx=True,
        logy=True,
    )

    # --- 7. storage -----------------------------------------------------------------------
    storage = measure_storage(connection, atlas_namespaces, peers, rid)
    growth_writes = 30 if smoke else 3000
    storage["per_write"] = measure_growth(
        connection,
        growth_singles(singles, models, client, writer, slug, pns, single_ns),
        growth_writes,
    )
    storage["per_batch_op"] = measure_growth(
        connection, batch_writes(bytes_batches), 1 if smoke else 3, ops=bytes_size
    )

    # --- profile (optional) ---------------------------------------------------------------
    profile_text = ""
    if args.profile and not smoke:
        profile_text = profile_atlas(atlas_service, atlas_http, counter, 300)

    raw.close()

    # --- record ---------------------------------------------------------------------------
    cmd = ".venv/bin/python bench/writes_vs_peers.py" + (" --smoke" if smoke else "")
    lines = [
        header(cmd),
        "",
        f"Each write updates one existing row with new content ({len(json.dumps(content(0)))}"
        f" bytes of JSON) in its own transaction. {rounds} rounds × {per_round} writes per"
        " implementation, interleaved (the order rotates each round) so load spikes hit all"
        " alike; median (p50) and p95 in ms; ratio = p50 / plain get()+save() p50 of the same"
        " run. Queries = SQL statements per write, BEGIN and COMMIT included"
        " (raw psycopg: one autocommit statement). Atlas's write outside any transaction"
        " is two: the unlocked read with its role rows, then the log statement, which"
        " writes compare-and-set and commits as it ends (a row that moved in between makes"
        " it retry locked; docs/architecture.md). In-process"
        " HTTP = DRF test client, token auth, a non-staff user with the writer role."
        " `Atlas service` is authorization as a request pays it: the same writer, as a"
        " fresh user object per write (no roles cached on it, so they are looked up as in a"
        " request), built without a query (the token lookup is left out, as plain"
        " get()+save() and the peers authenticate nobody; the HTTP row pays it). The two"
        " `roles known` rows are the service with the actor's roles already known: the"
        " writer object reused (roles cached on it after its first write), and a superuser"
        " (no role lookup at all; the figure this row showed before issue 17).",
        "",
        table(["single-entity write", "p50 ms", "p95 ms", "× plain", "queries", "n"], single_rows),
    ]
    write_section("Against the peers 1. Single-entity writes", "\n".join(lines))

    lines = [
        header(cmd),
        "",
        f"One transaction updating {head_size} existing rows (new content each round);"
        f" median and best of {batch_rounds[head_size]} interleaved rounds; ratio ="
        " median / the plain save() loop's median. Every path includes reading the rows it"
        " updates. Queries = SQL statements, BEGIN and COMMIT included.",
        "",
        table(
            [f"{head_size}-row batch", "median ms", "best ms", "× plain loop", "queries", "n"],
            batch_rows,
        ),
        "",
        "Median ms by batch size:",
        "",
        table(
            ["path", *[f"{size} rows" for size in sizes]],
            [
                [name, *[summary(by_size.get(size, []))["p50"] for size in sizes]]
                for name, by_size in batch_times.items()
            ],
        ),
        "",
        image("batch_time_vs_size.png", "batch time vs batch size"),
    ]
    write_section("Against the peers 2. Batches as one transaction", "\n".join(lines))

    lines = [
        header(cmd),
        "",
        f"**Per single-entity write**: what each implementation's history tables grow by"
        f" over {growth_writes:,} single-entity updates, divided by the writes"
        " (bench/_bytes_growth.py): every partition's main fork, indexes and TOAST, so"
        " half-empty pages count and a peer's side rows (django-reversion's revision,"
        " django-pghistory's context) count as part of the write. Atlas publishes its"
        " journal and vacuums it every 200 writes, as the relay and autovacuum keep it."
        " Each implementation twice: as a service call records it, and with what it records"
        " of a request (Atlas: its provenance, over in-process HTTP from an API client;"
        " django-simple-history and django-reversion: the user; django-pghistory: the"
        " context row its `HistoryMiddleware` writes, user and URL). Content is the same"
        f" {len(json.dumps(content(0)))}-byte JSON object for every implementation.",
        "",
        growth_table(["implementation", "tables", "bytes per write"], storage["per_write"]),
        "",
        *bytes_verdict(storage["per_write"]),
        "",
        f"**Per op of a {bytes_size:,}-op batch** (part 2's paths): the same growth over"
        f" {'one batch' if smoke else 'three batches'}, divided by the ops.",
        "",
        growth_table(["batch path", "tables", "bytes per op"], storage["per_batch_op"]),
        "",
        "**Row bytes** of the rows this run wrote: `row` = average `pg_column_size(row)`"
        " (TOAST-compressed where PostgreSQL compressed it); `+ indexes` adds the table's"
        " index bytes divided by all its rows. On Atlas's partitioned tables, whose"
        " partitions' indexes each keep a few pages however few rows they hold, that"
        " share overstates a row's cost in a table this small: the growth above is the"
        " measure.",
        "",
        table(
            ["table (what one row is)", "rows measured", "row bytes", "+ indexes bytes"],
            [[s["what"], s["rows"], s["row"], s["row"] + s["index"]] for s in storage["tables"]],
        ),
    ]
    write_section("Against the peers 7. Storage per revision", "\n".join(lines))
    if profile_text:
        write_section(
            "Against the peers: profile of Atlas's single-entity write",
            header(cmd + " --profile")
            + "\n\npyinstrument (wall clock, 0.2 ms sampling), frames under 2% hidden:\n\n"
            + profile_text,
        )
    result = {
        "single": single_result,
        "batch": batch_result,
        "batch_curve": {n: dict(zip(*c, strict=True)) for n, c in curve.items()},
        "storage": storage,
        "profile": profile_text,
        "seconds": time.monotonic() - started,
    }
    write_json(args.json, result)
    print(json.dumps({k: v for k, v in result.items() if k != "profile"}, indent=1, default=str))
    print(f"plots in {plots_dir()}")


def publish_journal() -> None:
    """Publish every outstanding journal entry, as the relay would after each commit
    (no relay runs here; the pumps are not woken): publishing deletes the entry."""
    from changesets.outbox import journal

    ids = list(journal.outstanding().values_list("pk", flat=True))
    for start in range(0, len(ids), journal.SWEEP_CHUNK):
        journal.publish(ids[start : start + journal.SWEEP_CHUNK], wake=lambda _subscriptions: None)


def measure_storage(connection: Any, atlas_namespaces: list[str], peers: bool, rid: str) -> dict:
    """Average row bytes of this run's rows, plus each table's index bytes per row.

    The journal is measured after its entries were published (:func:`publish_journal`),
    as they are moments after each commit in a running deployment: none is left, so a
    write's journal bytes are 0 (the table holds only outstanding work)."""

    def stats(relation: str, where: str, params: list[Any]) -> tuple[int, float, float]:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*), COALESCE(avg(pg_column_size(t.*)), 0) FROM {relation} t"
                f" WHERE {where}",
                params,
            )
            rows, avg = cursor.fetchone()
            cursor.execute(
                f"SELECT (SELECT sum(pg_indexes_size(r))::bigint"
                f" FROM (SELECT '{relation}'::regclass AS r"
                f" UNION ALL SELECT inhrelid::regclass FROM pg_inherits"
                f" WHERE inhparent = '{relation}'::regclass) p),"
                f" (SELECT count(*) FROM {relation})"
            )
            index_bytes, total = cursor.fetchone()
        return rows, float(avg), index_bytes / max(total, 1)

    tables = []

    def add(what: str, relation: str, where: str, params: list[Any]) -> dict[str, Any]:
        rows, avg, index = stats(relation, where, params)
        index = index if rows else 0.0  # no row of this run left: no index share either
        entry = {"what": what, "table": relation, "rows": rows, "row": avg, "index": index}
        tables.append(entry)
        return entry

    ns = list(atlas_namespaces)
    add("Atlas revision (changesets_revision)", "changesets_revision", "namespace = ANY(%s)", [ns])
    add(
        "Atlas changeset, single-entity write (changesets_changeset)",
        "changesets_changeset",
        "namespaces && %s::varchar[] AND op_count = 1",
        [ns],
    )
    add(
        "Atlas changeset, batch (changesets_changeset)",
        "changesets_changeset",
        "namespaces && %s::varchar[] AND op_count > 1",
        [ns],
    )
    publish_journal()
    add(
        "Atlas journal entry, once published (changesets_journalentry)",
        "changesets_journalentry",
        "changeset_id IN (SELECT id FROM changesets_changeset WHERE namespaces && %s::varchar[])",
        [ns],
    )
    if peers:
        add(
            "django-simple-history historical row",
            "bench_peers_historicalshitem",
            "namespace LIKE %s",
            [f"%{rid}"],
        )
        add(
            "django-reversion version (reversion_version)",
            "reversion_version",
            "TRUE",
            [],
        )
        add(
            "django-reversion revision (reversion_revision)",
            "reversion_revision",
            "TRUE",
            [],
        )
        add(
            "django-pghistory event (bench_peers_pghitemevent)",
            "bench_peers_pghitemevent",
            "namespace LIKE %s",
            [f"%{rid}"],
        )
    return {"tables": tables}


# Atlas's log tables; the journal is settled (published, vacuumed) as a deployment keeps it.
ATLAS_LOG = ("changesets_changeset", "changesets_revision", "changesets_journalentry")
# A request's client, as the provenance records it (bench/log_bytes.py's API client).
USER_AGENT = "python-httpx/0.28.1"


def growth_singles(
    singles: dict[str, Callable[[int], None]],
    models: dict[str, Any],
    client: Any,
    writer: Any,
    slug: Callable[[int], str],
    pns: str,
    single_ns: str,
) -> list[tuple[str, tuple[str, ...], Callable[[int], None]]]:
    """(name, log relations, write) for each implementation, without and with what a
    request records: Atlas's provenance (over HTTP, from an API client), the peers'
    user, and django-pghistory's context row as its ``HistoryMiddleware`` writes it
    (``user`` and ``url``, one row per request)."""
    import itertools

    counter = itertools.count(10**8)

    def atlas_http(i: int) -> None:
        response = client.put(
            f"/api/v1/entities/{single_ns}/item/{slug(i)}",
            {"content": content(next(counter))},
            format="json",
            HTTP_USER_AGENT=USER_AGENT,
        )
        assert response.status_code == 200, response.content[:300]

    out = [
        ("Atlas (service write: the system's provenance)", ATLAS_LOG, singles["Atlas service"]),
        ("Atlas (HTTP write: the request's provenance)", ATLAS_LOG, atlas_http),
    ]
    if "sh" not in models:
        return out
    import pghistory
    import reversion
    from django.db import transaction

    def saved(model: Any, i: int, **attrs: Any) -> None:
        obj = model.objects.get(namespace=pns, slug=slug(i))
        obj.content = content(next(counter))
        for name, value in attrs.items():
            setattr(obj, name, value)
        obj.save()

    def sh_user(i: int) -> None:
        with transaction.atomic():
            saved(models["sh"], i, _history_user=writer)

    def rv_user(i: int) -> None:
        with transaction.atomic(), reversion.create_revision():
            reversion.set_user(writer)
            saved(models["rv"], i)

    def pgh_context(i: int) -> None:
        url = f"/items/{pns}/{slug(i)}"
        with transaction.atomic(), pghistory.context(user=writer.pk, url=url):
            saved(models["pgh"], i)

    sh = ("bench_peers_historicalshitem",)
    rv = ("reversion_version", "reversion_revision")
    pgh = ("bench_peers_pghitemevent", "pghistory_context")
    return out + [
        ("django-simple-history", sh, singles["django-simple-history"]),
        ("django-simple-history (with the request's user)", sh, sh_user),
        ("django-reversion", rv, singles["django-reversion"]),
        ("django-reversion (with the request's user)", rv, rv_user),
        ("django-pghistory", pgh, singles["django-pghistory"]),
        ("django-pghistory (with its request context row)", pgh, pgh_context),
    ]


def growth_table(headers: list[str], measured: dict[str, dict[str, Any]]) -> str:
    """A table of :func:`measure_growth`'s results: name, its log tables, bytes."""
    return table(
        headers, [[name, ", ".join(v["relations"]), v["bytes"]] for name, v in measured.items()]
    )


def bytes_verdict(per_write: dict[str, dict[str, Any]]) -> list[str]:
    """Issue 16's target, Atlas at most twice the smallest peer's bytes per write, for
    a service write and for a request's; [] without the peers."""
    lines = []
    for atlas, with_request in (("Atlas (service", False), ("Atlas (HTTP", True)):
        found = against_peers(per_write, atlas, with_request)
        if found is None or found.ratio is None:
            continue
        met = "met" if found.ratio <= TARGET else "**missed**"
        lines.append(
            f"- {atlas[7:]} write: {found.mine:,.0f} B, {found.ratio:.2f}× the smallest peer"
            f" ({found.smallest}, {found.peers[found.smallest]:,.0f} B); target ≤ 2×: {met}."
        )
    return lines


# Part 2's batch paths whose bytes part 7 measures, and the tables each writes its history to.
BATCH_LOGS = {
    "Atlas service (one changeset)": ATLAS_LOG,
    "django-simple-history bulk_update_with_history()": ("bench_peers_historicalshitem",),
    "django-simple-history save() loop": ("bench_peers_historicalshitem",),
    "django-reversion save() loop": ("reversion_version", "reversion_revision"),
    "django-pghistory bulk_update() (triggers)": ("bench_peers_pghitemevent", "pghistory_context"),
    "django-pghistory save() loop": ("bench_peers_pghitemevent", "pghistory_context"),
}


def batch_writes(
    batches: dict[str, Callable[[int], int]],
) -> list[tuple[str, tuple[str, ...], Callable[[int], None]]]:
    """Part 2's batch paths that part 7 measures, as :func:`measure_growth` takes them:
    (name, log relations, one batch with new content)."""
    import itertools

    counter = itertools.count(2 * 10**8)
    return [
        (name, relations, lambda _i, run=batches[name]: run(next(counter)))
        for name, relations in BATCH_LOGS.items()
        if name in batches
    ]


def settle_journal() -> None:
    """Publish the journal and vacuum it: what the relay and autovacuum keep doing."""
    from django.db import connection

    publish_journal()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM changesets_journalentry")


def measure_growth(
    connection: Any,
    impls: list[tuple[str, tuple[str, ...], Callable[[int], None]]],
    writes: int,
    *,
    ops: int = 1,
) -> dict[str, dict[str, Any]]:
    """Bytes per op of each implementation (``_bytes_growth``) over ``writes`` calls of
    ``ops`` ops each (a single-entity write: one)."""
    out: dict[str, dict[str, Any]] = {}
    for name, relations, write in impls:
        settle = settle_journal if relations == ATLAS_LOG else None
        grown = growth_per_write(connection, relations, write, writes, settle=settle)
        out[name] = {
            "relations": list(relations),
            "writes": writes,
            "ops": writes * ops,
            "bytes": grown / ops,
        }
    return out


def profile_atlas(atlas_service: Any, atlas_http: Any, counter: Any, n: int) -> str:
    """pyinstrument of ``n`` Atlas single writes (service, then HTTP); '' if not installed."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        return ""
    out = []
    for name, fn in (("service", atlas_service), ("in-process HTTP PUT", atlas_http)):
        profiler = Profiler(interval=0.0002)
        with contextlib.ExitStack():
            profiler.start()
            for _ in range(n):
                fn(next(counter))
            profiler.stop()
        text = profiler.output_text(unicode=False, color=False, show_all=False)
        out.append(f"Atlas {name}, {n} writes:\n\n```\n{_trim(text)}\n```")
    return "\n\n".join(out)


def _trim(text: str, lines: int = 60) -> str:
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join(kept[:lines])


if __name__ == "__main__":
    main()
