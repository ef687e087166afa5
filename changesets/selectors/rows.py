"""History pages as plain rows: one statement, no model instances.

A history page is up to 51 revisions, each with two JSON images and its
changeset's author, time and rpc. Read with ``select_related`` it cost about
five times the statement itself (issue 17): Django built a ``Revision`` and a
``Changeset`` per row, with the signals, field descriptors and converters each
instance pays. Here one raw statement's rows become two small slotted objects
each, with the attribute names those models have, so the readers of a page
(``atlas.api.representations.revision_repr``, the admin timeline, the paging
position) read them unchanged. Each image is decoded once: Django has psycopg
hand ``jsonb`` over as text, and :func:`entities.store.load_json` parses it.
The before image is rebuilt here from ``after`` and the row's (small) ``undo``
(:func:`changesets.undo.before_image`), so a page reads and decodes one whole
image per revision, not two.

The changesets' columns come in a second statement, by the page's seqs
(:func:`with_briefs`), not joined: both log tables are partitioned by seq
(migration 0038), and a join planned a scan of every changeset partition for
each revision partition the page might read (run-time pruning skips them, but
only after planning). At ten million changesets that planning was most of a
history page's time in PostgreSQL. By the page's seqs, as literals, the
second statement is pruned when planned to the one or two partitions that
hold them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.db.backends.base.base import BaseDatabaseWrapper

from atlas.replicas import read_connection
from changesets.undo import before_image
from entities.store import load_json


@dataclass(slots=True)
class ChangesetBrief:
    """The columns of a revision's changeset that a history entry shows."""

    id: UUID
    author_name: str
    at: datetime
    rpc: str
    comment: str


@dataclass(slots=True)
class HistoryRow:
    """One revision as a history page shows it, with its changeset's brief."""

    id: int
    changeset_id: UUID
    seq: int
    branch: str
    at: datetime
    namespace: str
    kind: str
    slug: str
    op: str
    before: Any
    after: Any
    before_version: int | None
    after_version: int | None
    changed: list[str]
    changeset: ChangesetBrief


# The revision table keeps its own name (no alias): ``keys.KEY_RULE`` spells
# its columns that way, as the GIN index expression it must match does.
REVISION = "changesets_revision"
# ``at`` as integer microseconds since the epoch: psycopg loads an int8 in C,
# while the loader Django registers for ``timestamptz`` is pure Python (about
# 5 µs a value, more than half the page's fetch). One time per row: the
# changeset's ``at`` is the revision's (``Revision`` copies it; ``verify_log``
# checks the copy).
AT_MICROS = f"(extract(epoch from {REVISION}.at) * 1000000)::int8"
ROW_COLUMNS = (
    f"{REVISION}.id, {REVISION}.changeset_id, {REVISION}.seq, {REVISION}.branch,"
    f" {AT_MICROS}, {REVISION}.namespace, {REVISION}.kind, {REVISION}.slug, {REVISION}.op,"
    f" {REVISION}.undo, {REVISION}.after, {REVISION}.before_version,"
    f" {REVISION}.after_version, string_to_array({REVISION}.changed, '~2'),"
    f" {REVISION}.undo_gone"
)
SELECT_ROWS = f"SELECT {ROW_COLUMNS} FROM {REVISION}"
# A changeset's columns a history entry shows, by seq: the changesets of a page's
# revisions (:func:`with_briefs`).
_BRIEFS = (
    "SELECT seq, author_name, rpc, comment FROM changesets_changeset WHERE seq = ANY(%s::int8[])"
)


def bound_changesets(qs: Any, seq: int, *, op: str = ">") -> Any:
    """``qs`` (revisions whose values join their changesets) with the joined
    changesets bounded like the revisions: ``seq {op} seq`` on the changeset side.

    Django joins by ``seq`` and turns ``changeset__seq`` into the revision's own
    column, and PostgreSQL carries an equality across a join, not a range: with
    the bound on one side only, a merge join read the changesets from seq 1 up to
    the cursor (500,000 rows for a feed page in the middle of a 1M log). The
    changeset table's alias is its name (Django's for its first join).
    """
    assert op in (">", ">=", "<", "<=")
    return qs.extra(where=[f'"changesets_changeset"."seq" {op} %s'], params=[seq])


# The same columns for a queryset's ``values_list`` (annotated with ``at_micros``),
# in the order :func:`row_of` reads them.
VALUES = (
    "id",
    "changeset_id",
    "seq",
    "branch",
    "at_micros",
    "namespace",
    "kind",
    "slug",
    "op",
    "undo",
    "after",
    "before_version",
    "after_version",
    "changed",
    "undo_gone",
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def from_micros(micros: int) -> datetime:
    """An aware UTC time from epoch microseconds (:data:`AT_MICROS`): two C calls,
    where Django's ``timestamptz`` loader parses text in Python."""
    return _EPOCH + timedelta(microseconds=micros)


def with_briefs(rows: Sequence[Sequence[Any]]) -> list[HistoryRow]:
    """Rows of :data:`VALUES` (or :data:`ROW_COLUMNS`) as history rows, each
    with its changeset's brief: one statement for them all (the module says why)."""
    briefs = changeset_briefs({r[2] for r in rows})
    # A revision whose changeset went between the two statements (an archive cut
    # removes both after its grace period) is left out, as the join left it out.
    return [row_of(r, briefs[r[2]]) for r in rows if r[2] in briefs]


def changeset_briefs(
    seqs: Iterable[int], *, using: BaseDatabaseWrapper | None = None
) -> dict[int, tuple[str, str, str]]:
    """``(author_name, rpc, comment)`` of the changesets at ``seqs``, by seq: one
    statement, pruned to the partitions that hold them (none for no seqs). Read on
    ``using``, the connection the seqs came from (default: ``read_connection()``)."""
    wanted = sorted(set(seqs))
    if not wanted:
        return {}
    with (using or read_connection()).cursor() as cursor:
        cursor.execute(_BRIEFS, [wanted])
        return {seq: (author, rpc, comment) for seq, author, rpc, comment in cursor.fetchall()}


def row_of(r: Sequence[Any], brief: Sequence[Any]) -> HistoryRow:
    """A row of :data:`VALUES` (images decoded or still text) and its changeset's
    ``(author_name, rpc, comment)`` as a :class:`HistoryRow`."""
    at = _EPOCH + timedelta(microseconds=r[4])
    after = load_json(r[10])
    return HistoryRow(
        r[0],
        r[1],
        r[2],
        r[3],
        at,
        r[5],
        r[6],
        r[7],
        r[8],
        before_image(r[8], after, load_json(r[9]), r[14]),
        after,
        r[11],
        r[12],
        r[13],
        ChangesetBrief(r[1], brief[0], at, brief[1], brief[2]),
    )


def history_rows(
    where: str, params: Sequence[Any], *, before_seq: int | None, limit: int
) -> list[HistoryRow]:
    """Revisions matching ``where`` (SQL over the revision table, with ``params``),
    below ``before_seq`` if given, newest first, at most ``limit``: one statement,
    and one for their changesets."""
    sql = f"{SELECT_ROWS} WHERE {where}"
    args = list(params)
    if before_seq is not None:
        sql += f" AND {REVISION}.seq < %s"
        args.append(before_seq)
    sql += f" ORDER BY {REVISION}.seq DESC LIMIT %s"
    args.append(limit)
    with read_connection().cursor() as cursor:
        cursor.execute(sql, args)
        rows = cursor.fetchall()
    return with_briefs(rows)
