"""The one code path that removes rows from the hot log: an archive cut's removal.

Phase 1 (issue 21) removes by batched DELETE; a later phase detaches range
partitions here instead, and nothing outside this module changes. Why it is
shaped this way:

1. Bounded batches: each batch is its own short transaction of about
   ``ATLAS_ARCHIVE_DELETE_BATCH`` revisions (whole changesets), oldest first,
   so no statement holds locks or a snapshot for long and a crash loses at
   most one batch's work (the next run starts at the oldest row left).
2. The guard: the log's delete triggers (migration 0024) refuse every DELETE
   unless the transaction set ``atlas.archiving`` (``SET LOCAL``, so it ends
   with the transaction) and a signed, switched cut covers the row. This is
   the only place that sets it.
3. Writers never wait on it: it deletes rows no writer touches (old seqs),
   and takes no lock on the log head.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection, transaction

from atlas import conf

# How many changesets a batch looks at to decide where it ends.
_PEEK = 1000


def _batch_end(through: int, budget: int) -> tuple[int, int] | None:
    """(first, last) seq of the next batch: whole changesets, about ``budget`` revisions."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, op_count FROM changesets_changeset WHERE seq <= %s ORDER BY seq LIMIT %s",
            [through, _PEEK],
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


def remove_through(
    seq: int,
    *,
    batch: int | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> int:
    """Remove every changeset, revision and journal entry with seq <= ``seq``; rows removed.

    ``on_batch(last_seq, revisions)`` runs inside each batch's transaction (the
    archiver records its progress there, so progress and removal commit together).
    """
    budget = int(batch or conf.get("ATLAS_ARCHIVE_DELETE_BATCH"))
    removed = 0
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL atlas.archiving = 'on'")
            bounds = _batch_end(seq, budget)
            if bounds is None:
                return removed
            first, last = bounds
            with connection.cursor() as cursor:
                cursor.execute(
                    "DELETE FROM changesets_journalentry WHERE changeset_id IN"
                    " (SELECT id FROM changesets_changeset WHERE seq BETWEEN %s AND %s)",
                    [first, last],
                )
                cursor.execute(
                    "DELETE FROM changesets_revision WHERE seq BETWEEN %s AND %s", [first, last]
                )
                revisions = cursor.rowcount
                cursor.execute(
                    "DELETE FROM changesets_changeset WHERE seq BETWEEN %s AND %s", [first, last]
                )
            removed += revisions
            if on_batch is not None:
                on_batch(last, revisions)
