"""The one code path that removes rows from the hot log: an archive cut's removal.

Revisions and changesets are range-partitioned by seq on the same bounds
(``changesets.partitions``), and the planner ends a cut where a partition
ends, so both go a partition at a time: detached, then dropped, revisions
first (their foreign key points at the changesets). Journal entries are a
queue (publishing deletes them), so what is left of them goes by DELETE. Why
it is shaped this way:

1. Whole partitions, no DELETE: a detach and a drop cost the same whatever
   the partition holds, leave no dead tuples behind and no index to vacuum.
   The detach is ``CONCURRENTLY`` (``partitions.detach``: SHARE UPDATE
   EXCLUSIVE on the parent, which writers do not conflict with; a stopped one
   is finished by the next run); the drop is a short transaction under
   ``lock_timeout`` and retried (``partitions.run_with_lock_timeout``), so a
   writer queued behind it waits at most 50 ms. The detached table is renamed
   ``changesets_revision_x<lower>`` (``changesets_changeset_x<lower>``), so a
   crash between the detach and the drop leaves a table the next run finds and
   drops (one left before its rename is found too), and no upkeep ever
   attaches it again.
2. Never a partition whose segments were not verified: before a partition is
   detached (or a detached one dropped) a signed, switched cut must cover its
   last seq, and every segment of that cut must be verified
   (:func:`covered`). The DELETE guard of migration 0024 does not see a
   DROP, so this check is the guard for it.
3. Bounded batches for the rest: each batch is its own short transaction of
   about ``ATLAS_ARCHIVE_DELETE_BATCH`` revisions (whole changesets), oldest
   first, for rows a partition straddling the cut still holds (a cut made
   before the tables were partitioned), so a crash loses at most one batch's
   work. PostgreSQL itself refuses to drop a changeset partition that a
   revision partition's key still points into.
4. The guard: the log's delete triggers (migration 0024) refuse every DELETE
   unless the transaction set ``atlas.archiving`` (``SET LOCAL``) and a signed,
   switched cut covers the row. This is the only place that sets it.
5. Writers never wait long on it: it removes rows no writer touches (old
   seqs) and takes no lock on the log head.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection, transaction

from atlas import conf
from changesets import partitions
from changesets.archive.models import ArchiveCut, CutState, SegmentState

# A detached partition's new name: the parent's name, "_x", its lower bound.
DETACHED = "_x"

# How many changesets a batch looks at to decide where it ends.
_PEEK = 1000


def _batch_end(after: int, through: int, budget: int) -> tuple[int, int] | None:
    """(first, last) seq of the next batch after ``after``: whole changesets, about
    ``budget`` revisions."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, op_count FROM changesets_changeset WHERE seq > %s AND seq <= %s"
            " ORDER BY seq LIMIT %s",
            [after, through, _PEEK],
        )
        rows = cursor.fetchall()
    if not rows:
        return None
    last, total = rows[0][0], 0
    for seq, op_count in rows:
        if total and total + op_count > budget:
            break
        last, total = seq, total + op_count
    return rows[0][0], last


def covered(last_seq: int) -> bool:
    """Whether a signed, switched cut whose segments are all verified covers ``last_seq``."""
    cut = (
        ArchiveCut.objects.filter(
            seq__gte=last_seq,
            from_seq__lte=last_seq,
            state__in=[CutState.SWITCHED, CutState.REMOVED],
        )
        .exclude(signature="")
        .first()
    )
    if cut is None:
        return False
    return not cut.segments.exclude(state=SegmentState.VERIFIED).exists()


class NotCovered(Exception):
    """A partition was about to be dropped that no verified cut covers (a bug)."""


def _detached() -> list[tuple[str, int]]:
    """(table, its highest seq or -1 when empty) of tables a crash left detached."""
    with connection.cursor() as cursor:
        cursor.execute(
            # Renamed ones, and one a crash left detached before its rename.
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND NOT relispartition"
            " AND relname ~ '^changesets_(revision|changeset)_[px][0-9]{12}$'"
            " AND relnamespace = current_schema()::regnamespace ORDER BY relname",
        )
        names = [row[0] for row in cursor.fetchall()]
    return [(name, _highest(name)) for name in names]


def _count(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        return int(cursor.fetchone()[0])


def _highest(table: str) -> int:
    """The highest seq ``table`` holds (-1: none); one index probe."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(max(seq), -1) FROM {table}")
        return int(cursor.fetchone()[0])


def _drop_detached(name: str, last_seq: int, on_step: Callable[[str], None] | None) -> None:
    if last_seq >= 0 and not covered(last_seq):
        raise NotCovered(f"{name} holds seq {last_seq}, which no verified cut covers")
    partitions.run_with_lock_timeout([f"DROP TABLE {name}"])
    if on_step is not None:
        on_step("partition-dropped")


def _drop(parent: str, part: partitions.Partition, on_step: Callable[[str], None] | None) -> int:
    """Detach partition ``part`` of ``parent``, rename it away, drop it; rows it held."""
    held = _highest(part.name)
    if held >= 0 and not covered(held):
        raise NotCovered(f"{part.name} holds seq {held}: no verified cut covers it")
    rows = _count(part.name)
    away = f"{parent}{DETACHED}{part.lower:012d}"
    partitions.detach(part.name, parent)
    partitions.run_with_lock_timeout([f"ALTER TABLE {part.name} RENAME TO {away}"])
    partitions.forget()
    if on_step is not None:
        on_step("partition-detached")
    _drop_detached(away, held, on_step)
    return rows


def drop_partitions_through(seq: int, *, on_step: Callable[[str], None] | None = None) -> int:
    """Detach and drop every revision partition wholly at or below ``seq``, then every
    changeset partition; revisions dropped.

    A changeset partition goes once nothing is left of its seqs elsewhere
    (:func:`_clear_range`). ``on_step(point)`` runs after each detach
    (``partition-detached``) and drop (``partition-dropped``), outside any
    transaction (the archiver's pause points).
    """
    rows = 0
    for name, last_seq in _detached():  # what a crash between detach and drop left
        if name.startswith(partitions.PARENT):
            rows += _count(name)
        _drop_detached(name, last_seq, on_step)
    for part in partitions.partitions():
        if part.last_seq > seq:
            break
        rows += _drop(partitions.PARENT, part, on_step)
    for part in partitions.partitions(parent=partitions.CHANGESETS):
        if part.last_seq > seq:
            break
        rows += _clear_range(part)
        _drop(partitions.CHANGESETS, part, on_step)
    return rows


def _clear_range(part: partitions.Partition) -> int:
    """Delete what is left of a changeset partition's seqs in the other tables; revisions
    deleted. Its journal entries (one statement: the journal is a queue) and, only if a
    revision partition straddles its range (never on the bounds upkeep makes: the
    revision partitions of the range were dropped just before), those revisions in
    batches. One probe each when there are none, not a walk of the partition."""
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM changesets_journalentry WHERE seq BETWEEN %s AND %s",
            [part.lower, part.last_seq],
        )
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM changesets_revision WHERE seq BETWEEN %s AND %s)",
            [part.lower, part.last_seq],
        )
        left = bool(cursor.fetchone()[0])
    return _delete_batches(part.lower - 1, part.last_seq, changesets=False) if left else 0


def _delete_batches(
    after: int,
    through: int,
    *,
    changesets: bool = True,
    budget: int | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> int:
    """Delete the rows of seqs ``after+1..through`` in short guarded transactions; revisions
    deleted. Without ``changesets`` only what points at them (journal entries, revisions)."""
    budget = int(budget or conf.get("ATLAS_ARCHIVE_DELETE_BATCH"))
    removed = 0
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL atlas.archiving = 'on'")
            bounds = _batch_end(after, through, budget)
            if bounds is None:
                return removed
            first, last = bounds
            with connection.cursor() as cursor:
                # Usually nothing: publishing deletes an entry, and the plan keeps the
                # cut below every outstanding one. What is left is rows an older
                # release marked published, which the changesets' foreign key needs gone.
                cursor.execute(
                    "DELETE FROM changesets_journalentry WHERE seq BETWEEN %s AND %s",
                    [first, last],
                )
                cursor.execute(
                    "DELETE FROM changesets_revision WHERE seq BETWEEN %s AND %s", [first, last]
                )
                revisions = cursor.rowcount
                if changesets:
                    cursor.execute(
                        "DELETE FROM changesets_changeset WHERE seq BETWEEN %s AND %s",
                        [first, last],
                    )
            removed += revisions
            after = last
            if on_batch is not None:
                on_batch(last, revisions)


def remove_through(
    seq: int,
    *,
    batch: int | None = None,
    on_batch: Callable[[int, int], None] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> int:
    """Remove every changeset, revision and journal entry with seq <= ``seq``; revisions removed.

    Partitions wholly at or below ``seq`` are dropped first
    (:func:`drop_partitions_through`); then batches delete whatever rows are
    left (a partition straddling the cut, a table not partitioned).
    ``on_batch(last_seq, revisions)`` runs inside each batch's transaction (the
    archiver records its progress there, so progress and removal commit together).
    """
    removed = drop_partitions_through(seq, on_step=on_step)
    return removed + _delete_batches(0, seq, budget=batch, on_batch=on_batch)
