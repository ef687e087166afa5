"""A changeset found by its id, planned over the partition that holds it.

Why: the changeset table is partitioned by ``seq`` (migration 0038), and
``id = X`` names no partition, so PostgreSQL plans a probe of every partition's
primary key: 13 of them at 10M changesets, about 0.6 ms of planning for 0.04 ms
of work, on every page that names a changeset (its API page, ``as_of=<id>``,
the admin's page and its search by id, a revert). Ids are UUIDv7, made at
write time, so a closed partition's ids fall in a narrow ``[min, max]``: a
per-process map of those ranges turns an id into seq bounds, sent as literals,
which PostgreSQL prunes when it plans.

Why a stale map is safe: the bounds only narrow the search. A miss under them
is asked again without them (and drops the map), so a map older than the
newest partitions, a changeset imported with an id older than its seq, or a
partition loaded back from an archive costs one statement more, never a wrong
answer. The map is read again every :data:`MAP_SECONDS` (three catalog and
index statements; a partition's min and max id are one probe each of its
primary key).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from atlas.process_cache import Expiring
from changesets import partitions
from changesets.models import Changeset

# How long a process keeps the map. Only speed depends on it (see above).
MAP_SECONDS = 300.0


@dataclass(frozen=True)
class ClosedPartition:
    """A partition the log head has passed: no new changeset lands in it."""

    lower: int
    upper: int
    min_id: uuid.UUID
    max_id: uuid.UUID


@dataclass(frozen=True)
class IdMap:
    """Where ids lie: the closed partitions, and the seq the open ones start at."""

    closed: tuple[ClosedPartition, ...]
    open_from: int

    def bounds(self, changeset_id: uuid.UUID) -> tuple[int, int | None] | None:
        """``(lower, upper)`` seqs (``upper`` exclusive, None: open) to seek the id
        within; None when the map cannot narrow it (nothing closed yet, or an id
        outside every closed range that is not newer than all of them)."""
        if not self.closed:
            return None
        if changeset_id > max(p.max_id for p in self.closed):
            return self.open_from, None
        holding = [p for p in self.closed if p.min_id <= changeset_id <= p.max_id]
        if not holding:
            return None
        return min(p.lower for p in holding), max(p.upper for p in holding)


EMPTY = IdMap(closed=(), open_from=0)


def _load() -> IdMap:
    if not partitions.is_partitioned(parent=partitions.CHANGESETS):
        return EMPTY
    head = partitions.log_head()
    closed = [p for p in partitions.partitions(parent=partitions.CHANGESETS) if p.last_seq <= head]
    if not closed:
        return EMPTY
    # Names come from the catalog (``partition_name``'s digits and letters), never
    # from input; each arm is two probes of that partition's primary key (``min``
    # of a uuid exists from PostgreSQL 18 only).
    arms = " UNION ALL ".join(
        f"SELECT {p.lower}, {p.upper},"
        f" (SELECT id FROM {p.name} ORDER BY id LIMIT 1),"
        f" (SELECT id FROM {p.name} ORDER BY id DESC LIMIT 1)"
        for p in closed
    )
    with connection.cursor() as cursor:
        cursor.execute(arms)
        rows = cursor.fetchall()
    return IdMap(
        closed=tuple(
            ClosedPartition(lower, upper, low, high)
            for lower, upper, low, high in rows
            if low is not None  # an empty partition holds no id to find
        ),
        open_from=max(p.upper for p in closed),
    )


_map: Expiring[IdMap] = Expiring(_load, lambda: MAP_SECONDS)


def current() -> IdMap:
    """This process's map, read again when older than :data:`MAP_SECONDS`."""
    return _map.get()


def forget() -> None:
    """Drop the map: the next lookup reads it again."""
    _map.forget()


def prime(found: IdMap = EMPTY, *, seconds: float = float("inf")) -> None:
    """Set the map (tests start from :data:`EMPTY`: no bounds, no statement)."""
    _map.prime(found, seconds=seconds)


def _as_uuid(changeset_id: Any) -> uuid.UUID | None:
    try:
        return changeset_id if isinstance(changeset_id, uuid.UUID) else uuid.UUID(str(changeset_id))
    except (TypeError, ValueError):
        return None


def find(queryset: QuerySet, changeset_id: Any) -> Any:
    """``queryset``'s row with this id (``.first()``), planned over its partition
    when the map knows it; None when there is none (or the id is not a UUID)."""
    value = _as_uuid(changeset_id)
    if value is None:
        return None
    everywhere = queryset.filter(pk=value)
    bounds = current().bounds(value)
    if bounds is None:
        return everywhere.first()
    lower, upper = bounds
    within = everywhere.filter(seq__gte=lower)
    found = (within if upper is None else within.filter(seq__lt=upper)).first()
    if found is None:
        # Not where the map put it: look everywhere, and read the map again if it
        # was there after all (the map was stale, or the id is older than its seq).
        found = everywhere.first()
        if found is not None:
            forget()
    return found


def seq_of(changeset_id: Any) -> int | None:
    """The seq of the changeset with this id, visible or not (None: no such row)."""
    return find(Changeset.objects.values_list("seq", flat=True), changeset_id)
