"""As-of list pages vs the live page, at any depth of history.

    .venv/bin/python bench/asof.py [--entities 10000] [--updates-per-entity 100] [--repeat 25]

Populates (once; reused on later runs) a namespace ``bench.asof`` with
10,000 entities and about 1,000,000 revisions in ~505,000 changesets, using
set-based SQL through Atlas's own schema (the log is append-only, so this is
the same shape the write service produces: creates, then updates, each row
carrying both images and versions). Then times a 500-entity page of current
entities against the same page as of 10, 10,000 and 500,000 changesets back,
records an EXPLAIN ANALYZE, and writes both to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time

from _common import interleaved_ms, summary
from _setup import setup, write_section

NS = "bench.asof"
PAYLOAD = "x" * 80


def populate(cursor, entities: int, updates: int) -> None:
    """Revision r (0-based): entity r % E, life step r // E (0 = create), changeset r // 2."""
    total = entities * (updates + 1)
    cursor.execute("SELECT seq FROM changesets_loghead WHERE id = 1 FOR UPDATE")
    base = cursor.fetchone()[0]
    changesets = (total + 1) // 2
    print(f"populating {entities} entities, {total} revisions, {changesets} changesets ...")
    started = time.perf_counter()
    cursor.execute(
        "INSERT INTO entities_namespace (name, protected, created_at) VALUES (%s, false, now())",
        [NS],
    )
    # Time-ordered UUIDs (v7 layout) from seq, one changeset per two revisions.
    cursor.execute(
        """
        INSERT INTO changesets_changeset
            (id, seq, author_id, author_name, at, message, comment, branch, rpc, op_count,
             namespaces, prev_hash, hash)
        SELECT (lpad(to_hex((1700000000000 + g)::bigint), 12, '0') || '7000' || '8'
                || lpad(to_hex(%(base)s + g), 15, '0'))::uuid,
               %(base)s + g, NULL, 'bench', to_timestamp((1700000000000 + g) / 1000.0),
               'BatchMutate: 2 change(s)', '', '', 'BatchMutate', 2, ARRAY[%(ns)s], NULL, NULL
        FROM generate_series(1, %(n)s) AS g
        """,
        {"base": base, "n": changesets, "ns": NS},
    )
    cursor.execute(
        """
        INSERT INTO changesets_revision
            (changeset_id, seq, branch, at, namespace, kind, slug, op, undo, after,
             before_version, after_version, changed)
        SELECT (lpad(to_hex((1700000000000 + g)::bigint), 12, '0') || '7000' || '8'
                || lpad(to_hex(%(base)s + g), 15, '0'))::uuid,
               %(base)s + g, '', to_timestamp((1700000000000 + g) / 1000.0),
               %(ns)s, 'item', 'e' || lpad((r %% %(e)s)::text, 6, '0'),
               CASE WHEN r < %(e)s THEN 'create' ELSE 'update' END,
               -- the before image as stored (atlas_undo of these images, spelled out)
               CASE WHEN r < %(e)s THEN NULL ELSE jsonb_build_object('v', r / %(e)s - 1) END,
               jsonb_build_object('v', r / %(e)s, 'payload', %(p)s),
               CASE WHEN r < %(e)s THEN NULL ELSE r / %(e)s END,
               r / %(e)s + 1,
               -- atlas_changed_keys of these images, spelled out (cheaper at 1M rows),
               -- stored joined by '~2' (migration 0035)
               CASE WHEN r < %(e)s THEN '/payload~2/v' ELSE '/v' END
        FROM generate_series(0, %(total)s - 1) AS r, LATERAL (SELECT r / 2 + 1 AS g) AS cs
        """,
        {"base": base, "e": entities, "total": total, "ns": NS, "p": PAYLOAD},
    )
    # Bulk-loaded history the write service would take hours to write: as the table's
    # owner, turn the entity write guard off for this one insert (entities/writer.py).
    cursor.execute("ALTER TABLE entities_entity DISABLE TRIGGER entity_write_guard")
    cursor.execute(
        """
        INSERT INTO entities_entity
            (namespace_id, kind, slug, content, version, created_at, updated_at, changeset_id)
        SELECT %(ns)s, 'item', 'e' || lpad(e::text, 6, '0'),
               jsonb_build_object('v', %(u)s, 'payload', %(p)s), %(u)s + 1, now(), now(),
               (lpad(to_hex((1700000000000 + g)::bigint), 12, '0') || '7000' || '8'
                || lpad(to_hex(%(base)s + g), 15, '0'))::uuid
        FROM generate_series(0, %(e)s - 1) AS e,
             LATERAL (SELECT (%(u)s * %(e)s + e) / 2 + 1 AS g) AS cs
        """,
        {"ns": NS, "u": updates, "e": entities, "p": PAYLOAD, "base": base},
    )
    # ALTER TABLE refuses while the insert's deferred foreign-key checks are queued.
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    cursor.execute("ALTER TABLE entities_entity ENABLE TRIGGER entity_write_guard")
    cursor.execute(
        "UPDATE changesets_loghead SET seq = %s, at = GREATEST(at, to_timestamp(%s / 1000.0))"
        " WHERE id = 1",
        [base + changesets, 1700000000000 + changesets],
    )
    cursor.execute("ANALYZE changesets_revision")
    cursor.execute("ANALYZE changesets_changeset")
    cursor.execute("ANALYZE entities_entity")
    print(f"populated in {time.perf_counter() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entities", type=int, default=10_000)
    parser.add_argument("--updates-per-entity", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=25)
    parser.add_argument("--page", type=int, default=500)
    args = parser.parse_args()
    setup()

    from django.db import connection, transaction

    from changesets.models import Changeset, Revision
    from changesets.selectors.asof import _statement, entities_as_of
    from entities.models import Namespace
    from entities.store import baseline, entity_filters

    if not Namespace.objects.filter(name=NS).exists():
        with transaction.atomic(), connection.cursor() as cursor:
            populate(cursor, args.entities, args.updates_per_entity)
    revisions = Revision.objects.filter(namespace=NS).count()
    head = Changeset.objects.filter(namespaces__contains=[NS]).order_by("-seq").first().seq
    first = Changeset.objects.filter(namespaces__contains=[NS]).order_by("seq").first().seq
    print(f"{NS}: {revisions} revisions, changesets seq {first}..{head}")

    def live() -> list:
        return baseline.list(namespaces=None, namespace=NS, limit=args.page)

    reads = [("current entities", live)]
    for depth in (10, 10_000, 500_000):
        seq = head - depth
        if seq < first:
            continue

        def page(seq: int = seq) -> list:
            return entities_as_of(seq=seq, namespaces=None, namespace=NS, limit=args.page)

        reads.append((f"as of {depth:,} changesets back", page))
    timed = interleaved_ms(dict(reads), args.repeat)
    rows = [
        (name, summary(timed[name])["p50"], summary(timed[name])["p95"], len(fn()))
        for name, fn in reads
    ]

    # The same pages through the HTTP API (in-process test client, no network):
    # what a client pays, rendering included.
    from django.conf import settings
    from rest_framework.test import APIClient

    from tests.entities.factories import SuperuserFactory

    settings.ALLOWED_HOSTS = ["testserver"]
    client = APIClient()
    client.force_authenticate(SuperuserFactory(username="bench-root-reader"))
    url = f"/api/v1/entities?namespace={NS}&page_size={args.page}"

    def http(query: str = "") -> None:
        response = client.get(url + query)
        assert response.status_code == 200, response.content[:300]

    http_reads = [("current entities", http)]
    for depth in (10, 10_000, 500_000):
        target = Changeset.objects.filter(seq=head - depth).first()
        if target is None:
            continue
        http_reads.append(
            (f"as of {depth:,} changesets back", lambda t=target: http(f"&as_of={t.id}"))
        )
    timed = interleaved_ms(dict(http_reads), args.repeat)
    http_rows = [
        (name, summary(timed[name])["p50"], summary(timed[name])["p95"]) for name, _ in http_reads
    ]

    where, params = entity_filters(
        "namespace",
        "kind",
        "slug",
        namespaces=None,
        namespace=NS,
        kind=None,
        slug_prefix=None,
        after=None,
    )
    plans = {}
    for depth in (10, 500_000):
        seq = max(first, head - depth)
        with connection.cursor() as cursor:
            for _ in range(3):  # the last of three: warm, like the timed runs
                cursor.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + _statement(where, seq),
                    [seq, *params, args.page + 32, seq],
                )
                plans[depth] = "\n".join(r[0] for r in cursor.fetchall())

    base_median = rows[0][1]
    lines = [
        f"{revisions:,} revisions over {args.entities:,} entities; page of {args.page};"
        f" median and p95 of {args.repeat} interleaved rounds, in-process through the"
        " selectors.",
        "Command: `.venv/bin/python bench/asof.py`.",
        "",
        "| read | median ms | p95 ms | rows | × current |",
        "|---|---|---|---|---|",
    ]
    for name, median, p95, count in rows:
        lines.append(
            f"| {name} | {median:.2f} | {p95:.2f} | {count} | {median / base_median:.2f} |"
        )
    lines += [
        "",
        "The same pages through `GET /api/v1/entities` (in-process client, rendering included):",
        "",
        "| read | median ms | p95 ms | × current |",
        "|---|---|---|---|",
    ]
    for name, median, p95 in http_rows:
        lines.append(f"| {name} | {median:.2f} | {p95:.2f} | {median / http_rows[0][1]:.2f} |")
    for depth, plan in plans.items():
        lines += [
            "",
            f"EXPLAIN ANALYZE of the as-of page {depth:,} changesets back:",
            "",
            "```",
            plan,
            "```",
        ]
    text = "\n".join(lines)
    print(text)
    write_section("As-of pages at any depth", text)


if __name__ == "__main__":
    main()
