"""The log's rows as the archive reads them: raw SQL, a bounded chunk at a time.

Model instances cost several times the statement for millions of rows
(``changesets.selectors.rows`` measured it), so the archiver reads plain
rows into small namespaces with the models' attribute names, which is all
``changesets.chain`` and ``changesets.archive.segments`` ask of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from django.db import connection

from changesets.models import MESSAGE_SQL

# Changesets per statement, and about how many revisions a chunk may hold.
CHUNK = 500
REVISION_BUDGET = 5_000

# The hashes as their hex text, what the chain and the segment files use (the
# columns store the bytes: ``changesets.fields.ChainHashField``); the message as
# the changeset reads it (NULL stored means the rule's: ``changesets.models``).
CHANGESET_COLUMNS = (
    f"id, seq, author_name, at, {MESSAGE_SQL} AS message, comment, branch, rpc, op_count,"
    " namespaces,"
    " encode(prev_hash, 'hex') AS prev_hash, encode(hash, 'hex') AS hash, metadata, context,"
    " encode(v1_hash, 'hex') AS v1_hash"
)
# The before image rebuilt in SQL (``changesets.undo``): segments keep both whole
# images, in jsonb's key order as the column used to give them.
REVISION_COLUMNS = (
    "id, changeset_id, seq, branch, at, namespace, kind, slug, op,"
    " atlas_before_image(op, after, undo, undo_gone) AS before, after,"
    " before_version, after_version, string_to_array(changed, '~2') AS changed, salt, sealed"
)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _rows(cursor: Any) -> list[SimpleNamespace]:
    names = [c.name for c in cursor.description]
    return [SimpleNamespace(**dict(zip(names, row, strict=True))) for row in cursor.fetchall()]


def revision_rows(cursor: Any) -> list[SimpleNamespace]:
    """A revision statement's rows with images, seal and salt decoded."""
    rows = _rows(cursor)
    for row in rows:
        row.before, row.after, row.sealed = _json(row.before), _json(row.after), _json(row.sealed)
        row.salt = None if row.salt is None else bytes(row.salt)
        row.pk = row.id
    return rows


def pairs(
    first_seq: int, last_seq: int, *, prev_hash: str
) -> Iterator[tuple[SimpleNamespace, list[SimpleNamespace]]]:
    """(changeset, its revisions in write order) for seqs ``first..last``, in seq order.

    ``prev_hash`` is the chain hash before ``first_seq``. Each changeset's
    ``prev_hash`` is filled in from it and the rows read: one written since
    migration 0034 stores none, because it is the previous row's ``hash``."""
    after, last_hash = first_seq - 1, prev_hash
    while after < last_seq:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {CHANGESET_COLUMNS} FROM changesets_changeset"
                " WHERE seq > %s AND seq <= %s ORDER BY seq LIMIT %s",
                [after, last_seq, CHUNK],
            )
            chunk = _rows(cursor)
            if not chunk:
                return
            taken: list[SimpleNamespace] = []
            budget = 0
            for row in chunk:
                if taken and budget + row.op_count > REVISION_BUDGET:
                    break
                taken.append(row)
                budget += row.op_count
            for row in taken:
                row.metadata, row.context = _json(row.metadata), _json(row.context)
            # By the chunk's seq range (the partition key, and the lead of
            # ``revision_seq_entity``), then the ids: one or two partitions' range.
            cursor.execute(
                f"SELECT {REVISION_COLUMNS} FROM changesets_revision"
                " WHERE seq >= %s AND seq <= %s AND changeset_id = ANY(%s)"
                " ORDER BY changeset_id, id",
                [taken[0].seq, taken[-1].seq, [row.id for row in taken]],
            )
            by_changeset: dict[Any, list[SimpleNamespace]] = {row.id: [] for row in taken}
            for revision in revision_rows(cursor):
                by_changeset[revision.changeset_id].append(revision)
        for row in taken:
            row.prev_hash = row.prev_hash or last_hash
            last_hash = row.hash
            yield row, by_changeset[row.id]
        after = taken[-1].seq


def op_counts(after_seq: int, last_seq: int) -> Iterator[tuple[int, int, list[str]]]:
    """(seq, op_count, namespaces) of every changeset in ``after..last``, in seq order."""
    while after_seq < last_seq:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT seq, op_count, namespaces FROM changesets_changeset"
                " WHERE seq > %s AND seq <= %s ORDER BY seq LIMIT 10000",
                [after_seq, last_seq],
            )
            rows = cursor.fetchall()
        if not rows:
            return
        yield from rows
        after_seq = rows[-1][0]
