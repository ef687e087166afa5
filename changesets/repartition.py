"""Move the revision table onto range partitions by ``seq``, and back (migration 0025).

Run inside the migration's transaction, as the table owner, with nothing else
writing. Why it is shaped this way:

1. Rows never pass through Python: each seq range is one server-side
   ``INSERT … SELECT`` from the old table (read by its ``seq`` index), so
   memory is one statement's whatever the log's size, and a progress bar on
   stderr counts the rows moved.
2. The table's shape is read from the catalog, not restated here: its
   columns (``LIKE``, with defaults, the identity, check constraints and
   storage), every index, constraint and trigger (``pg_get_indexdef``,
   ``pg_get_constraintdef``, ``pg_get_triggerdef``) are taken before the move
   and made again on the new table after the rows are in (bulk load first,
   indexes after: faster, and the index pages are dense). So the append-only,
   erasure and delete guards, the GIN index and the as-of expression index
   come through as they were.
3. Partitioned, the primary key and the unique constraint must include the
   partition key: ``PRIMARY KEY (id, seq)``, and ``seq`` joins
   ``revision_one_per_entity_changeset`` (the changeset implies its seq, so the
   constraint means the same). The reverse takes ``seq`` out again.
4. The identity sequence goes on where it was (its last value is carried over),
   so ids stay unique across the move.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from changesets import partitions

TABLE = partitions.PARENT
OLD = "changesets_revision_moving"
# Seqs per INSERT … SELECT (one progress step).
CHUNK_SEQS = 20_000


@dataclass
class Shape:
    """What the table carries besides its columns, as SQL to make it again."""

    constraints: list[tuple[str, str, str]] = field(default_factory=list)  # name, type, def
    indexes: list[str] = field(default_factory=list)
    triggers: list[str] = field(default_factory=list)
    sequence: str | None = None
    last_value: tuple[int, bool] | None = None


def _shape(cursor: Any) -> Shape:
    shape = Shape()
    cursor.execute(
        "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype IN ('p', 'u', 'f') ORDER BY contype, conname",
        [TABLE],
    )
    shape.constraints = list(cursor.fetchall())
    cursor.execute(
        "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = %s::regclass"
        " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid"
        " AND c.conrelid = i.indrelid) ORDER BY i.indexrelid",
        [TABLE],
    )
    # (a partitioned table's definitions say ON ONLY, which a plain one does not need)
    shape.indexes = [row[0].replace(" ON ONLY ", " ON ", 1) for row in cursor.fetchall()]
    cursor.execute(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass"
        " AND NOT tgisinternal AND tgparentid = 0 ORDER BY tgname",
        [TABLE],
    )
    shape.triggers = [row[0] for row in cursor.fetchall()]
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [TABLE])
    shape.sequence = cursor.fetchone()[0]
    if shape.sequence:
        cursor.execute(f"SELECT last_value, is_called FROM {shape.sequence}")
        shape.last_value = cursor.fetchone()
    return shape


def _key_columns(definition: str, *, partitioned: bool) -> str:
    """A PRIMARY KEY / UNIQUE definition with ``seq`` added (partitioned) or taken out.

    Only a trailing ``seq`` is one this move added and takes out again; a key that
    leads with it (``revision_seq_entity``, migration 0028) means it, and keeps it.
    """
    match = re.match(r"^(PRIMARY KEY|UNIQUE) \((.*)\)(.*)$", definition)
    if match is None:
        return definition
    kind, columns, rest = match.groups()
    names = [c.strip() for c in columns.split(",")]
    if partitioned and "seq" not in names:
        names.append("seq")
    elif not partitioned and len(names) > 1 and names[-1] == "seq":
        names.pop()
    return f"{kind} ({', '.join(names)}){rest}"


def _rename_away(cursor: Any, shape: Shape) -> None:
    cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {OLD}")
    if shape.sequence:
        cursor.execute(f"ALTER SEQUENCE {shape.sequence} RENAME TO {OLD}_id_seq")


def _create(cursor: Any, *, partitioned: bool) -> None:
    like = (
        f"LIKE {OLD} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY"
        " INCLUDING STORAGE INCLUDING COMPRESSION INCLUDING GENERATED"
    )
    tail = " PARTITION BY RANGE (seq)" if partitioned else ""
    cursor.execute(f"CREATE TABLE {TABLE} ({like}){tail}")


def _columns(cursor: Any) -> str:
    cursor.execute(
        "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
        [TABLE],
    )
    return str(cursor.fetchone()[0])


def _make_partitions(cursor: Any, *, top: int, width: int, ahead: int) -> None:
    for lower, upper in partitions.missing(0, top + 1 + ahead * width, [], step=width):
        cursor.execute(
            f"CREATE TABLE {partitions.partition_name(lower)} PARTITION OF {TABLE}"
            f" FOR VALUES FROM ({lower}) TO ({upper})"
        )


def _copy(cursor: Any, *, progress: bool) -> int:
    cursor.execute(f"SELECT min(seq), max(seq), count(*) FROM {OLD}")
    low, high, total = cursor.fetchone()
    if not total:
        return 0
    columns = _columns(cursor)
    bar = tqdm(total=total, unit="revision", desc="partition revisions", disable=not progress)
    moved = 0
    for start in range(int(low), int(high) + 1, CHUNK_SEQS):
        cursor.execute(
            f"INSERT INTO {TABLE} ({columns}) SELECT {columns} FROM {OLD}"
            " WHERE seq >= %s AND seq < %s",
            [start, start + CHUNK_SEQS],
        )
        moved += cursor.rowcount
        bar.update(cursor.rowcount)
    bar.close()
    return moved


def _restore_shape(cursor: Any, shape: Shape, *, partitioned: bool) -> None:
    for name, kind, definition in shape.constraints:
        if kind in ("p", "u"):
            definition = _key_columns(definition, partitioned=partitioned)
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {name} {definition}")
    for statement in [*shape.indexes, *shape.triggers]:
        cursor.execute(statement)
    if shape.last_value is not None:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, %s)",
            [TABLE, shape.last_value[0], shape.last_value[1]],
        )
    cursor.execute(f"ANALYZE {TABLE}")


def _move(cursor: Any, *, partitioned: bool, progress: bool, width: int, ahead: int) -> int:
    shape = _shape(cursor)
    cursor.execute("SELECT coalesce(max(seq), 0) FROM changesets_loghead")
    head = int(cursor.fetchone()[0])
    cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
    cursor.execute(f"SELECT coalesce(max(seq), 0) FROM {TABLE}")
    top = max(head, int(cursor.fetchone()[0]))
    _rename_away(cursor, shape)
    _create(cursor, partitioned=partitioned)
    if partitioned:
        _make_partitions(cursor, top=top, width=width, ahead=ahead)
    moved = _copy(cursor, progress=progress)
    cursor.execute(f"DROP TABLE {OLD}")
    _restore_shape(cursor, shape, partitioned=partitioned)
    return moved


def to_partitioned(cursor: Any, *, progress: bool, width: int, ahead: int) -> int | None:
    """Move a plain revision table onto partitions; rows moved (None: partitioned already)."""
    if partitions.is_partitioned(cursor):
        return None
    return _move(cursor, partitioned=True, progress=progress, width=width, ahead=ahead)


def to_plain(cursor: Any, *, progress: bool) -> int | None:
    """The reverse: one plain table again (None: it is one already)."""
    if not partitions.is_partitioned(cursor):
        return None
    return _move(cursor, partitioned=False, progress=progress, width=1, ahead=1)
