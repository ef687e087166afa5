"""The peers' side of part 3 (bench/history_pages.py runs it): history tables and history pages.

For each peer, the same history as Atlas's population in the same database: E =
N/100 items (``bench_peers_<peer>item``, slugs ``e0000000``… like Atlas's entities,
ids 1…E), each with 100 history rows (the create, then 99 updates of
``{"v": step, "payload": …}``), written in the same interleaved order (row r is a
change of item r mod E), each dated like the Atlas revision it mirrors — with
set-based SQL, the rows the peer itself writes on save:

- django-simple-history: a ``bench_peers_historicalshitem`` row per save (the
  snapshot, ``history_date``, ``history_type`` ``+``/``~``, no user or reason);
- django-reversion: a ``reversion_revision`` row per save (``create_revision()``
  around each save: ``date_created``, empty comment, no user) and its
  ``reversion_version`` row (``serialized_data`` as its JSON serializer writes it,
  ``object_repr``, ``object_id`` text, the content type, ``db`` = ``default``);
- django-pghistory: a ``bench_peers_pghitemevent`` row per insert/update (its
  triggers' snapshot: ``pgh_label`` ``insert``/``update``, ``pgh_obj_id``, no context).

Secondary indexes and constraints are dropped before the load and rebuilt after it
(exactly as the peer's migrations define them: only the peers' own indexes). Each
peer loads in one transaction, so a peer whose live rows exist is complete.

A page: the peer's idiomatic newest-50 of one object, through its public API.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from _common import drop_for_load

PEERS = ("django-simple-history", "django-reversion", "django-pghistory")
# Each peer's live table: its rows (namespace = the Atlas namespace) mark a finished load.
LIVE_TABLE = {
    "django-simple-history": "bench_peers_shitem",
    "django-reversion": "bench_peers_rvitem",
    "django-pghistory": "bench_peers_pghitem",
}
# The calls timed, as the doc shows them.
CALLS = {
    "django-simple-history": "item.history.all()[:50]",
    "django-reversion": 'Version.objects.get_for_object(item).select_related("revision")[:50]',
    "django-pghistory": 'item.events.order_by("-pgh_created_at", "-pgh_id")[:50]',
}
# The same instant as the Atlas revision of row r (ten revisions per changeset).
AT_OF_R = "to_timestamp((1700000000000 + r / %(k)s + 1) / 1000.0)"
SLUG_OF_E = "'e' || lpad(({e})::text, 7, '0')"


def _live_rows(cursor, table: str, ns: str, entities: int, total: int, payload: str) -> None:
    """The E live items (ids 1…E) at their last version, and the identity moved past them."""
    cursor.execute(
        f"""
        INSERT INTO {table} (id, namespace, slug, content)
        SELECT e + 1, %(ns)s, {SLUG_OF_E.format(e="e")},
               jsonb_build_object('v', (%(total)s - 1 - e) / %(e)s, 'payload', %(p)s)
        FROM generate_series(0, %(e)s - 1) AS e
        """,
        {"ns": ns, "e": entities, "total": total, "p": payload},
    )
    cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s)", [entities])


def _bulk(cursor, tables: tuple[str, ...], load: Callable[[], None]) -> tuple[float, float]:
    """Drop ``tables``' secondary indexes and constraints, ``load()``, rebuild them.

    Returns (load seconds, rebuild seconds)."""
    started = time.perf_counter()
    recreate = drop_for_load(cursor, tables)
    load()
    loaded = time.perf_counter()
    for statement in recreate:
        cursor.execute(statement)
    return loaded - started, time.perf_counter() - loaded


def populate_sh(cursor, ns: str, entities: int, total: int, k: int, payload: str):
    def load() -> None:
        _live_rows(cursor, "bench_peers_shitem", ns, entities, total, payload)
        cursor.execute(
            f"""
            INSERT INTO bench_peers_historicalshitem
                (id, namespace, slug, content, history_id, history_date,
                 history_change_reason, history_type, history_user_id)
            SELECT e + 1, %(ns)s, {SLUG_OF_E.format(e="e")},
                   jsonb_build_object('v', step, 'payload', %(p)s), r + 1,
                   {AT_OF_R}, NULL,
                   CASE WHEN step = 0 THEN '+' ELSE '~' END, NULL
            FROM generate_series(0, %(total)s - 1) AS r,
                 LATERAL (SELECT r %% %(e)s AS e, r / %(e)s AS step) AS x
            """,
            {"ns": ns, "e": entities, "total": total, "p": payload, "k": k},
        )
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('bench_peers_historicalshitem', 'history_id'),"
            " %s)",
            [total],
        )

    return _bulk(cursor, ("bench_peers_historicalshitem",), load)


def populate_rv(cursor, ns: str, entities: int, total: int, k: int, payload: str):
    from django.contrib.contenttypes.models import ContentType

    from bench.peers.models import RVItem

    content_type = ContentType.objects.get_for_model(RVItem).pk

    def load() -> None:
        _live_rows(cursor, "bench_peers_rvitem", ns, entities, total, payload)
        cursor.execute(
            f"""
            INSERT INTO reversion_revision (id, date_created, comment, user_id)
            SELECT r + 1, {AT_OF_R}, '', NULL
            FROM generate_series(0, %(total)s - 1) AS r
            """,
            {"total": total, "k": k},
        )
        # serialized_data exactly as django.core.serializers' JSON serializer writes it
        # (checked against it after the load: check_rv_serialization).
        cursor.execute(
            f"""
            INSERT INTO reversion_version
                (id, object_id, format, serialized_data, object_repr, content_type_id,
                 revision_id, db)
            SELECT r + 1, (e + 1)::text, 'json',
                   '[{{"model": "bench_peers.rvitem", "pk": ' || (e + 1)
                   || ', "fields": {{"namespace": "' || %(ns)s || '", "slug": "' || slug
                   || '", "content": {{"v": ' || step || ', "payload": "' || %(p)s
                   || '"}}}}}}]',
                   %(ns)s || '/' || slug, %(ct)s, r + 1, 'default'
            FROM generate_series(0, %(total)s - 1) AS r,
                 LATERAL (SELECT r %% %(e)s AS e, r / %(e)s AS step) AS x,
                 LATERAL (SELECT {SLUG_OF_E.format(e="e")} AS slug) AS s
            """,
            {"ns": ns, "e": entities, "total": total, "p": payload, "ct": content_type},
        )
        for table in ("reversion_revision", "reversion_version"):
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s)", [total])

    return _bulk(cursor, ("reversion_version", "reversion_revision"), load)


def populate_pgh(cursor, ns: str, entities: int, total: int, k: int, payload: str):
    def load() -> None:
        # Its insert trigger would write the create events; they are written below with
        # the rest, dated like the others.
        cursor.execute("ALTER TABLE bench_peers_pghitem DISABLE TRIGGER USER")
        _live_rows(cursor, "bench_peers_pghitem", ns, entities, total, payload)
        cursor.execute("ALTER TABLE bench_peers_pghitem ENABLE TRIGGER USER")
        cursor.execute(
            f"""
            INSERT INTO bench_peers_pghitemevent
                (pgh_id, pgh_created_at, pgh_label, id, namespace, slug, content,
                 pgh_context_id, pgh_obj_id)
            SELECT r + 1, {AT_OF_R},
                   CASE WHEN step = 0 THEN 'insert' ELSE 'update' END,
                   e + 1, %(ns)s, {SLUG_OF_E.format(e="e")},
                   jsonb_build_object('v', step, 'payload', %(p)s), NULL, e + 1
            FROM generate_series(0, %(total)s - 1) AS r,
                 LATERAL (SELECT r %% %(e)s AS e, r / %(e)s AS step) AS x
            """,
            {"ns": ns, "e": entities, "total": total, "p": payload, "k": k},
        )
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('bench_peers_pghitemevent', 'pgh_id'), %s)",
            [total],
        )

    return _bulk(cursor, ("bench_peers_pghitemevent",), load)


POPULATE = {
    "django-simple-history": populate_sh,
    "django-reversion": populate_rv,
    "django-pghistory": populate_pgh,
}
# The tables to VACUUM ANALYZE after a peer's load.
TABLES = {
    "django-simple-history": ("bench_peers_shitem", "bench_peers_historicalshitem"),
    "django-reversion": ("bench_peers_rvitem", "reversion_revision", "reversion_version"),
    "django-pghistory": ("bench_peers_pghitem", "bench_peers_pghitemevent"),
}
HISTORY_TABLES = {
    "django-simple-history": ("bench_peers_historicalshitem",),
    "django-reversion": ("reversion_version", "reversion_revision"),
    "django-pghistory": ("bench_peers_pghitemevent",),
}


def populated(cursor, peer: str, ns: str) -> bool:
    cursor.execute(f"SELECT 1 FROM {LIVE_TABLE[peer]} WHERE namespace = %s LIMIT 1", [ns])
    return cursor.fetchone() is not None


def populate(peer: str, ns: str, entities: int, total: int, k: int, payload: str) -> dict:
    """Load ``peer``'s history in one transaction, then VACUUM ANALYZE; the seconds each took."""
    from django.db import connection, transaction

    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL maintenance_work_mem = '512MB'")
        cursor.execute("SET LOCAL work_mem = '64MB'")
        load_s, index_s = POPULATE[peer](cursor, ns, entities, total, k, payload)
    vacuum = time.perf_counter()
    with connection.cursor() as cursor:
        for table in TABLES[peer]:
            cursor.execute(f"VACUUM ANALYZE {table}")
    ended = time.perf_counter()
    return {
        "load_s": load_s,
        "index_s": index_s,
        "vacuum_s": ended - vacuum,
        "total_s": ended - started,
    }


def check_rv_serialization(slug: str) -> None:
    """The loaded ``serialized_data`` is what django-reversion would have written."""
    from django.core import serializers
    from reversion.models import Version

    from bench.peers.models import RVItem

    item = RVItem.objects.get(slug=slug)
    version = Version.objects.get_for_object(item).first()
    expected = serializers.serialize("json", (item,), fields=("id", "namespace", "slug", "content"))
    assert version.serialized_data == expected, (version.serialized_data, expected)
    assert version.field_dict["content"] == item.content


def readers(slugs: list[str]) -> dict[str, Callable[[int], Any]]:
    """Per peer, a call ``f(i)`` that reads the newest 50 history entries of target ``i``.

    The items themselves are loaded before (untimed): each call is the history query
    alone, like Atlas's selector, which takes the key."""
    from reversion.models import Version

    from bench.peers.models import PGHItem, RVItem, SHItem

    def load(model) -> list:
        by_slug = {o.slug: o for o in model.objects.filter(slug__in=set(slugs))}
        return [by_slug[s] for s in slugs]

    sh, rv, pgh = load(SHItem), load(RVItem), load(PGHItem)

    def sh_page(i: int) -> None:
        rows = list(sh[i].history.all()[:50])
        assert len(rows) == 50, len(rows)

    def rv_page(i: int) -> None:
        rows = list(Version.objects.get_for_object(rv[i]).select_related("revision")[:50])
        assert len(rows) == 50, len(rows)

    def pgh_page(i: int) -> None:
        rows = list(pgh[i].events.order_by("-pgh_created_at", "-pgh_id")[:50])
        assert len(rows) == 50, len(rows)

    return {
        "django-simple-history": sh_page,
        "django-reversion": rv_page,
        "django-pghistory": pgh_page,
    }


def page_sql(peer: str, slug: str) -> tuple[str, Any]:
    """The SQL and parameters of ``peer``'s page for the item ``slug`` (for EXPLAIN)."""
    from reversion.models import Version

    from bench.peers.models import PGHItem, RVItem, SHItem

    if peer == "django-simple-history":
        qs = SHItem.objects.get(slug=slug).history.all()[:50]
    elif peer == "django-reversion":
        qs = Version.objects.get_for_object(RVItem.objects.get(slug=slug))
        qs = qs.select_related("revision")[:50]
    else:
        qs = PGHItem.objects.get(slug=slug).events.order_by("-pgh_created_at", "-pgh_id")[:50]
    return qs.query.sql_with_params()


def table_bytes(cursor, peer: str) -> int:
    total = 0
    for name in HISTORY_TABLES[peer]:
        cursor.execute(  # over its partitions (Atlas's revision table is partitioned)
            "SELECT sum(pg_total_relation_size(r))::bigint FROM (SELECT %s::regclass AS r UNION ALL"
            " SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = %s::regclass) p",
            [name, name],
        )
        total += cursor.fetchone()[0]
    return total
