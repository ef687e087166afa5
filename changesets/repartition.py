"""Move a log table onto range partitions by ``seq``, and back (migrations 0025 and 0038).

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
5. The changeset table (migration 0038) goes the same way, on the revision
   table's bounds. The revision table's key to it is taken off first and put
   back after, on the revision table's parent or on each of its partitions
   (:func:`changesets_to_partitioned`, ``partitions.key_revisions``); its
   extended statistics are made again on the parent and on each partition
   (the planner estimates a partition's scan from the partition's own).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from tqdm import tqdm

from changesets import partitions

TABLE = partitions.PARENT
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
    statistics: list[str] = field(default_factory=list)


def _shape(cursor: Any, table: str) -> Shape:
    shape = Shape()
    cursor.execute(
        "SELECT conname, contype, pg_get_constraintdef(oid) FROM pg_constraint"
        # (conparentid: not the clones a key to a partitioned table has per partition)
        " WHERE conrelid = %s::regclass AND contype IN ('p', 'u', 'f') AND conparentid = 0"
        " ORDER BY contype, conname",
        [table],
    )
    shape.constraints = list(cursor.fetchall())
    cursor.execute(
        "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = %s::regclass"
        " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid"
        " AND c.conrelid = i.indrelid) ORDER BY i.indexrelid",
        [table],
    )
    # (a partitioned table's definitions say ON ONLY, which a plain one does not need)
    shape.indexes = [row[0].replace(" ON ONLY ", " ON ", 1) for row in cursor.fetchall()]
    cursor.execute(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass"
        " AND NOT tgisinternal AND tgparentid = 0 ORDER BY tgname",
        [table],
    )
    shape.triggers = [row[0] for row in cursor.fetchall()]
    cursor.execute(
        "SELECT pg_get_statisticsobjdef(oid) FROM pg_statistic_ext WHERE stxrelid = %s::regclass"
        " ORDER BY stxname",
        [table],
    )
    shape.statistics = [row[0] for row in cursor.fetchall()]
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
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


def _rename_away(cursor: Any, table: str, shape: Shape) -> str:
    old = f"{table}_moving"
    cursor.execute(f"ALTER TABLE {table} RENAME TO {old}")
    if shape.sequence:
        cursor.execute(f"ALTER SEQUENCE {shape.sequence} RENAME TO {old}_id_seq")
    return old


def _create(cursor: Any, table: str, old: str, *, partitioned: bool) -> None:
    like = (
        f"LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY"
        " INCLUDING STORAGE INCLUDING COMPRESSION INCLUDING GENERATED"
    )
    tail = " PARTITION BY RANGE (seq)" if partitioned else ""
    cursor.execute(f"CREATE TABLE {table} ({like}){tail}")


def _columns(cursor: Any, table: str) -> str:
    cursor.execute(
        "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
        [table],
    )
    return str(cursor.fetchone()[0])


def _bounds(cursor: Any, table: str, *, top: int, width: int, ahead: int) -> list[tuple[int, int]]:
    """The ranges ``table`` is laid out on: a second table takes the revision table's."""
    alike = [] if table == partitions.PARENT else partitions.partitions(cursor)
    made = partitions.missing(0, top + 1 + ahead * width, alike, step=width)
    return sorted([(p.lower, p.upper) for p in alike] + made)


def _make_partitions(cursor: Any, table: str, *, top: int, width: int, ahead: int) -> None:
    for lower, upper in _bounds(cursor, table, top=top, width=width, ahead=ahead):
        cursor.execute(
            f"CREATE TABLE {partitions.partition_name(lower, table)} PARTITION OF {table}"
            f" FOR VALUES FROM ({lower}) TO ({upper})"
        )


def _copy(cursor: Any, table: str, old: str, *, progress: bool) -> int:
    cursor.execute(f"SELECT min(seq), max(seq), count(*) FROM {old}")
    low, high, total = cursor.fetchone()
    if not total:
        return 0
    columns = _columns(cursor, table)
    unit = table.rsplit("_", 1)[-1]
    bar = tqdm(total=total, unit=unit, desc=f"partition {unit}s", disable=not progress)
    moved = 0
    for start in range(int(low), int(high) + 1, CHUNK_SEQS):
        cursor.execute(
            f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {old}"
            " WHERE seq >= %s AND seq < %s",
            [start, start + CHUNK_SEQS],
        )
        moved += cursor.rowcount
        bar.update(cursor.rowcount)
    bar.close()
    return moved


def _for_partition(statistics: str, partition: str) -> str:
    """A ``CREATE STATISTICS`` definition made for ``partition``, under a name of its own."""
    match = re.match(r"^CREATE STATISTICS (?:\S+\.)?(\S+) (.*) FROM \S+$", statistics)
    assert match is not None, statistics
    name, body = match.groups()
    own = f"{partition}_{name}"[:63]  # (PostgreSQL's longest name)
    return f"CREATE STATISTICS {own} {body} FROM {partition}"


def _restore_shape(cursor: Any, table: str, shape: Shape, *, partitioned: bool) -> None:
    for name, kind, definition in shape.constraints:
        if kind in ("p", "u"):
            definition = _key_columns(definition, partitioned=partitioned)
        cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
    for statement in [*shape.indexes, *shape.triggers, *shape.statistics]:
        cursor.execute(statement)
    for part in partitions.partitions(cursor, parent=table) if partitioned else []:
        for statement in shape.statistics:
            cursor.execute(_for_partition(statement, part.name))
    if table == partitions.PARENT and partitioned:
        partitions.key_revisions(cursor)  # (after migration 0038: a key per partition)
    if shape.last_value is not None:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, %s)",
            [table, shape.last_value[0], shape.last_value[1]],
        )
    cursor.execute(f"ANALYZE {table}")


def _move(
    cursor: Any, table: str, *, partitioned: bool, progress: bool, width: int, ahead: int
) -> int:
    shape = _shape(cursor, table)
    cursor.execute("SELECT coalesce(max(seq), 0) FROM changesets_loghead")
    head = int(cursor.fetchone()[0])
    cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    cursor.execute(f"SELECT coalesce(max(seq), 0) FROM {table}")
    top = max(head, int(cursor.fetchone()[0]))
    old = _rename_away(cursor, table, shape)
    _create(cursor, table, old, partitioned=partitioned)
    if partitioned:
        _make_partitions(cursor, table, top=top, width=width, ahead=ahead)
    moved = _copy(cursor, table, old, progress=progress)
    cursor.execute(f"DROP TABLE {old}")
    _restore_shape(cursor, table, shape, partitioned=partitioned)
    return moved


def to_partitioned(
    cursor: Any, *, progress: bool, width: int, ahead: int, table: str = TABLE
) -> int | None:
    """Move a plain ``table`` onto partitions; rows moved (None: partitioned already)."""
    if partitions.is_partitioned(cursor, table):
        return None
    return _move(cursor, table, partitioned=True, progress=progress, width=width, ahead=ahead)


def to_plain(cursor: Any, *, progress: bool, table: str = TABLE) -> int | None:
    """The reverse: one plain table again (None: it is one already)."""
    if not partitions.is_partitioned(cursor, table):
        return None
    return _move(cursor, table, partitioned=False, progress=progress, width=1, ahead=1)


# The key the revision table's parent has while the changeset table is plain, and
# each revision partition has once it is partitioned (``partitions.REVISION_KEY``).
_PARENT_KEY = (
    f"ALTER TABLE {TABLE} ADD CONSTRAINT {partitions.REVISION_KEY} FOREIGN KEY (seq)"
    f" REFERENCES {partitions.CHANGESETS} (seq) DEFERRABLE INITIALLY DEFERRED"
)


def changesets_to_partitioned(cursor: Any, *, progress: bool, width: int, ahead: int) -> int | None:
    """Move the changeset table onto partitions (migration 0038); rows moved.

    The revision table's key moves from its parent to each of its partitions
    (``partitions._revision_keys`` says why).
    """
    if partitions.is_partitioned(cursor, partitions.CHANGESETS):
        return None
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    cursor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {partitions.REVISION_KEY}")
    moved = to_partitioned(
        cursor, progress=progress, width=width, ahead=ahead, table=partitions.CHANGESETS
    )
    partitions.key_revisions(cursor)
    return moved


def changesets_to_plain(cursor: Any, *, progress: bool) -> int | None:
    """The reverse: one plain changeset table, the revision table's key on its parent."""
    if not partitions.is_partitioned(cursor, partitions.CHANGESETS):
        return None
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    _unkey_revisions(cursor)
    moved = to_plain(cursor, progress=progress, table=partitions.CHANGESETS)
    cursor.execute(_PARENT_KEY)
    return moved


def _unkey_revisions(cursor: Any) -> None:
    """Drop each revision partition's own key to its changeset partition (not one it
    inherits from the parent, as before migration 0038)."""
    cursor.execute(
        "SELECT conrelid::regclass::text FROM pg_constraint WHERE conname = %s"
        " AND conparentid = 0 AND conrelid IN (SELECT inhrelid FROM pg_inherits"
        " WHERE inhparent = %s::regclass)",
        [partitions.REVISION_KEY, TABLE],
    )
    for (table,) in cursor.fetchall():
        cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT {partitions.REVISION_KEY}")


def lay_out(bounds: list[tuple[int, int]], parents: tuple[str, ...] = partitions.PARENTS) -> None:
    """Put each (empty) table of ``parents`` on partitions of ``bounds`` instead of its own.

    For tests and benchmarks that need a log on chosen bounds. The revision
    partitions' keys go first (a changeset partition one points into cannot be
    dropped) and are made again to the new partitions.
    """
    with connection.cursor() as cursor:
        _unkey_revisions(cursor)
        for parent in parents:
            for part in partitions.partitions(cursor, parent=parent):
                cursor.execute(f"DROP TABLE {part.name}")
    for parent in sorted(parents, key=partitions.PARENTS.index):
        for lower, upper in bounds:  # as upkeep makes them (statistics included)
            partitions.attach(parent, lower, upper, lock_timeout=False)
    with connection.cursor() as cursor:
        partitions.key_revisions(cursor)
    partitions.forget()
