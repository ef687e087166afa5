"""Migrations that rewrite the log, applied to a database that already holds one.

A migration tested only on an empty database can fail on every real one:
0013's first version built its index over the rows' replaced versions too
(CREATE INDEX indexes what the backfill's UPDATE had just superseded) and
failed on any log with revisions.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from changesets import rechain
from changesets.models import Revision

pytestmark = pytest.mark.django_db(transaction=True)

NS = "acme.orders"
BEFORE_CHANGED_KEYS = [("changesets", "0012_journal_seq")]


def migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


def latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def test_changed_keys_migrate_onto_a_log_with_revisions(staff, namespace, write):
    write(staff, f"{NS}/order/a", {"x": {"y": 1}, "z": 1})
    write(staff, f"{NS}/order/a", {"x": {"y": 2}, "z": 1})
    write(staff, f"{NS}/order/b", {"k": [1]})
    write(staff, f"{NS}/order/b", None)
    expected = dict(Revision.objects.values_list("id", "changed"))
    assert len(expected) == 4 and all(expected.values())

    migrate(BEFORE_CHANGED_KEYS)  # the log as it was before changed keys existed
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'changesets_revision' AND column_name = 'changed'"
        )
        assert cursor.fetchone()[0] == 0
    with connection.cursor() as cursor:
        # Full pages, so the backfill's updates cannot stay on their page (HOT), as
        # in any real log: the replaced versions then stay in the table until COMMIT.
        cursor.execute(
            "INSERT INTO changesets_revision (changeset_id, seq, branch, at, namespace, kind,"
            " slug, op, before, after, before_version, after_version)"
            " SELECT c.id, c.seq, '', c.at, %s, 'bulk', 'r' || n, 'update',"
            " jsonb_build_object('n', n, 'pad', repeat('x', 200)),"
            " jsonb_build_object('n', n + 1, 'pad', repeat('x', 200)), 1, 2"
            " FROM generate_series(1, 3000) n,"
            " (SELECT id, seq, at FROM changesets_changeset ORDER BY seq LIMIT 1) c",
            [NS],
        )
    # The raw rows are not in the chain, and 0018 refuses to re-chain a log that
    # does not verify as v1: hash them in (as v1) before it runs, as if written so.
    migrate([("changesets", "0017_erasure_chain_v2")])
    with connection.cursor() as cursor:
        rechain.rechain_to_v1(cursor, progress=False)
    migrate(latest())

    assert Revision.objects.filter(kind="bulk", changed=["/n"]).count() == 3000
    expected_ids = list(expected)
    assert dict(Revision.objects.filter(id__in=expected_ids).values_list("id", "changed")) == (
        expected
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM changesets_revision WHERE atlas_key_terms(branch, namespace,"
            " changed) && atlas_key_query(branch, namespace, '/x')"
        )
        assert cursor.fetchone()[0] == 2
