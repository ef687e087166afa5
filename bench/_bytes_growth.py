"""Bytes a history keeps per single-entity write: what its tables grow by, divided by the writes.

Averages of ``pg_column_size`` plus ``pg_indexes_size / rows`` (the table section 7 also
prints) are only as good as the table they divide: on a log whose tables are
partitioned, every partition's indexes hold a few empty pages whatever their rows, and
in a benchmark's small tables that fixed share was counted as if each row cost it.
Growth has no such share: each implementation writes ``n`` single-entity updates, and
its log relations (every partition; the main fork, the indexes and the TOAST table)
are measured before and after. What a write leaves behind is then whatever it costs
in pages, half-empty index pages included, and a peer's side rows (django-pghistory's
context row, django-reversion's revision row) count as what they are: part of the write.

Atlas's journal entry is deleted once published (``changesets.outbox.journal``); a
running deployment publishes within milliseconds and autovacuum reuses the pages, so
the writes here publish it and vacuum the journal every ``every`` writes, as the relay
and autovacuum keep it. What the journal still grows by is counted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

# Main fork, indexes and TOAST (table and index) of a relation and of its partitions.
# No free-space or visibility maps: VACUUM makes those, not a write.
_FOOTPRINT = """
SELECT COALESCE(sum(pg_relation_size(c.oid) + pg_indexes_size(c.oid)
    + COALESCE(pg_relation_size(c.reltoastrelid), 0)
    + COALESCE(pg_indexes_size(NULLIF(c.reltoastrelid, 0)), 0)), 0)::bigint
FROM pg_class c
WHERE c.oid = %(rel)s::regclass
   OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %(rel)s::regclass)
"""


def footprint(cursor: Any, relations: Sequence[str]) -> int:
    """Bytes on disk of ``relations`` and their partitions (see :data:`_FOOTPRINT`)."""
    total = 0
    for relation in relations:
        cursor.execute(_FOOTPRINT, {"rel": relation})
        total += cursor.fetchone()[0]
    return total


def growth_per_write(
    connection: Any,
    relations: Sequence[str],
    write: Callable[[int], None],
    n: int,
    *,
    settle: Callable[[], None] | None = None,
    every: int = 200,
) -> float:
    """Bytes ``relations`` grow by per call of ``write``, over ``n`` calls.

    ``settle`` (Atlas: publish the journal and vacuum it) runs every ``every`` writes
    and once more before the last measure.
    """
    with connection.cursor() as cursor:
        if settle:
            settle()
        before = footprint(cursor, relations)
        for i in range(n):
            write(i)
            if settle and (i + 1) % every == 0:
                settle()
        if settle:
            settle()
        after = footprint(cursor, relations)
    return (after - before) / n


# Issue 16's target: Atlas's bytes at most this many times the smallest peer's.
TARGET = 2.0


class Against(NamedTuple):
    """Atlas's bytes beside the peers' in one measure: ``smallest`` and ``ratio`` are
    None when no peer was measured."""

    mine: float
    peers: dict[str, float]
    smallest: str | None
    ratio: float | None


def against_peers(
    measured: dict[str, dict[str, Any]], atlas: str = "Atlas", request: bool | None = None
) -> Against | None:
    """The Atlas entry whose name starts with ``atlas`` beside the peers' entries, all of
    them or (``request``) only those with (or without) what a request records; None when
    Atlas was not measured."""
    mine = next((v["bytes"] for k, v in measured.items() if k.startswith(atlas)), None)
    if mine is None:
        return None
    peers = {
        k: v["bytes"]
        for k, v in measured.items()
        if not k.startswith("Atlas") and (request is None or ("request" in k) == request)
    }
    if not peers:
        return Against(mine, peers, None, None)
    smallest = min(peers, key=peers.__getitem__)
    return Against(mine, peers, smallest, mine / peers[smallest])
