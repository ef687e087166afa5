"""Every foreign key has an index on its referencing columns, on every partition.

PostgreSQL checks a foreign key when a referenced row is deleted by looking the
referencing rows up by the key's columns alone, once per deleted row. Without
an index that leads with those columns each check scans the referencing table:
migration 0028 left ``changesets_revision.changeset_id`` without one, and an
archive cut's removal (which deletes changesets) became quadratic in the cut
(at 7.9M changesets one batch of 2,000 had not committed after ten minutes).
Migration 0030 put the index back; migration 0031 made the key go by ``seq``
instead, which ``revision_seq_entity`` leads with. This keeps every key covered.
"""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db

# The referencing table and every partition under it, each with its index
# definitions' leading columns, by name (a partition's column numbers may differ;
# an expression, attnum 0, counts as a column no key has, so an index led by
# one does not cover the column after it).
UNCOVERED = """
WITH fk AS (
    SELECT c.conname, c.conrelid AS parent,
           array_agg(a.attname::text ORDER BY k.n) AS cols
    FROM pg_constraint c
    CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)
    JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
    WHERE c.contype = 'f' AND c.conparentid = 0
    GROUP BY c.conname, c.conrelid
),
rel AS (
    SELECT fk.conname, fk.cols, fk.parent AS relid FROM fk
    UNION ALL
    SELECT fk.conname, fk.cols, i.inhrelid FROM fk JOIN pg_inherits i ON i.inhparent = fk.parent
),
idx AS (
    SELECT i.indrelid AS relid, i.indexrelid,
           array_agg(COALESCE(a.attname::text, '(expression)') ORDER BY k.n) AS cols
    FROM pg_index i
    CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
    LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indisvalid
    GROUP BY i.indrelid, i.indexrelid
)
SELECT rel.conname, rel.relid::regclass::text, rel.cols
FROM rel
WHERE NOT EXISTS (
    SELECT 1 FROM idx l
    WHERE l.relid = rel.relid AND l.cols[1:cardinality(rel.cols)] = rel.cols
)
ORDER BY 1, 2
"""


def _uncovered() -> list[tuple[str, str, list[str]]]:
    with connection.cursor() as cursor:
        cursor.execute(UNCOVERED)
        return list(cursor.fetchall())


def test_every_foreign_key_has_an_index_leading_with_its_columns():
    assert _uncovered() == []


def test_the_revision_key_is_covered_on_every_partition():
    """The revision's key goes by seq (migration 0031; a key on each partition
    since 0038), which each partition's ``revision_seq_entity`` leads with."""
    from changesets import partitions

    with connection.cursor() as cursor:
        parts = partitions.partitions(cursor)
        assert parts, "the test database has revision partitions"
        cursor.execute(
            "SELECT count(DISTINCT i.indrelid) FROM pg_index i"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
            " WHERE a.attname = 'seq' AND i.indrelid = ANY(%s::regclass[])",
            [[part.name for part in parts]],
        )
        assert cursor.fetchone()[0] == len(parts)


def test_the_check_finds_it_when_the_index_is_gone():
    """The query above is not vacuous: without a seq-led index it names the key."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE changesets_revision DROP CONSTRAINT revision_seq_entity")
    uncovered = _uncovered()
    # Each revision partition has its own key (migration 0038): every one is named.
    from changesets import partitions

    names = [part.name for part in partitions.partitions()]
    assert names
    assert uncovered == [("revision_changeset_seq", name, ["seq"]) for name in names]
