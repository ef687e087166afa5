"""The state at a cut in the database (``ArchiveBase``): built, digested, retired.

As-of reads after a cut need, per baseline key alive at the cut, its life's
create and its newest revision at or before the cut (``changesets.archive.
state`` says why those two). They are copied here before the revisions go:

1. Only keys with baseline revisions in ``(previous cut, cut]`` change; the
   others keep their rows, still valid at the new cut.
2. Each changed key's new rows come from the log as the previous cut reads it
   (the previous state beside the revisions after it), so the revisions before
   the previous cut, long removed, are never needed.
3. New rows are valid from the new cut; the old rows of changed keys are valid
   until it. Reads at the previous cut keep reading theirs until they move.

Building is idempotent (a rerun after a crash first undoes a partial build),
one transaction, and takes no lock a writer waits for.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

from django.db import connection, transaction

from changesets.archive import reader, state

_COLUMNS = (
    "changeset_id, seq, branch, at, namespace, kind, slug, op, before, after,"
    " before_version, after_version, changed, salt, sealed"
)
# The same columns read off the revision table, whose rows store the before image
# as what differs from ``after`` (``changesets.undo``): the state keeps it whole.
_FROM_REVISIONS = _COLUMNS.replace(
    " before,", " atlas_before_image(op, after, undo, undo_gone) AS before,"
).replace(" changed,", " string_to_array(changed, '~2') AS changed,")
_TOUCHED = """
CREATE TEMP TABLE archive_touched ON COMMIT DROP AS
    SELECT DISTINCT namespace, kind, slug FROM changesets_revision
    WHERE branch = '' AND seq > %(prev)s AND seq <= %(cut)s
"""
_INSERT = f"""
INSERT INTO changesets_archivebase (revision_id, valid_from, valid_to, {_COLUMNS})
WITH src AS (
    SELECT id, {_FROM_REVISIONS} FROM changesets_revision
    WHERE branch = '' AND seq > %(prev)s AND seq <= %(cut)s
    UNION ALL
    SELECT b.revision_id, {", ".join("b." + c.strip() for c in _COLUMNS.split(","))}
    FROM changesets_archivebase b JOIN archive_touched t
      ON (t.namespace, t.kind, t.slug) = (b.namespace, b.kind, b.slug)
    WHERE b.valid_from <= %(prev)s AND (b.valid_to IS NULL OR b.valid_to > %(prev)s)
), newest AS (
    SELECT DISTINCT ON (namespace, kind, slug) * FROM src
    ORDER BY namespace, kind, slug, seq DESC
), creates AS (
    SELECT DISTINCT ON (namespace, kind, slug) * FROM src WHERE op = 'create'
    ORDER BY namespace, kind, slug, seq DESC
), kept AS (
    SELECT * FROM newest WHERE op <> 'delete'
    UNION ALL
    SELECT c.* FROM creates c JOIN newest n USING (namespace, kind, slug)
    WHERE n.op <> 'delete' AND c.seq <> n.seq
)
SELECT id, %(cut)s::bigint, NULL::bigint, {_COLUMNS} FROM kept
"""
_RETIRE = """
UPDATE changesets_archivebase b SET valid_to = %(cut)s
FROM archive_touched t
WHERE (t.namespace, t.kind, t.slug) = (b.namespace, b.kind, b.slug)
  AND b.valid_from <= %(prev)s AND b.valid_to IS NULL
"""


def build(*, cut: int, previous: int) -> int:
    """Steps 1-3 of the module docstring for the cut at ``cut``; rows valid at it."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM changesets_archivebase WHERE valid_from = %s", [cut])
        cursor.execute(
            "UPDATE changesets_archivebase SET valid_to = NULL WHERE valid_to = %s", [cut]
        )
        cursor.execute("DROP TABLE IF EXISTS archive_touched")
        for statement in (_TOUCHED, _INSERT, _RETIRE):
            cursor.execute(statement, {"cut": cut, "prev": previous})
        cursor.execute(
            "SELECT count(*) FROM changesets_archivebase"
            " WHERE valid_from <= %s AND (valid_to IS NULL OR valid_to > %s)",
            [cut, cut],
        )
        return int(cursor.fetchone()[0])


def rows_at(cut: int) -> Iterator[SimpleNamespace]:
    """The state rows valid at ``cut`` (revision-like objects), a chunk at a time."""
    after = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id AS base_id, revision_id AS id, {_COLUMNS}"
                " FROM changesets_archivebase WHERE id > %s AND valid_from <= %s"
                " AND (valid_to IS NULL OR valid_to > %s) ORDER BY base_id LIMIT 5000",
                [after, cut, cut],
            )
            rows = reader.revision_rows(cursor)
        if not rows:
            return
        yield from rows
        after = rows[-1].base_id


def digest_at(cut: int) -> str:
    """The state digest of the rows valid at ``cut`` (what the checkpoint signs)."""
    return state.digest(state.row_line(row) for row in rows_at(cut))


def purge(through: int) -> int:
    """Delete rows no reader can use any more: those retired at or before ``through``."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM changesets_archivebase WHERE valid_to IS NOT NULL AND valid_to <= %s",
            [through],
        )
        return cursor.rowcount
