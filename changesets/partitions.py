"""The log's range partitions by ``seq``: what exists, and upkeep ahead of the head.

``changesets_revision`` (migration 0025) and ``changesets_changeset`` (migration
0038) are range-partitioned by ``seq`` on the same bounds, with no DEFAULT
partition, so an archive cut can detach and drop whole partitions of both
(``changesets.archive.hot``). Without a DEFAULT partition a revision whose seq
no partition covers cannot be written, so upkeep keeps partitions ahead of the
log head, in both tables. Why it is shaped this way:

1. No DEFAULT partition: with one, PostgreSQL refuses ``DETACH … CONCURRENTLY``
   and every new partition must scan the DEFAULT one under an ACCESS EXCLUSIVE
   lock (and fails if a row for its range had landed there), so a safety net
   would turn a missed upkeep into a blocked one. Instead upkeep keeps
   ``ATLAS_LOG_PARTITIONS_AHEAD`` partitions of ``ATLAS_LOG_PARTITION_SEQS``
   seqs each beyond the head, and it runs from four places: ``migrate``
   (``post_migrate``), the beat task ``changesets.partition_upkeep``, the
   archiver before each cut, and a cheap check in the journal relay, which
   every committed changeset passes (:func:`check_headroom` with the relay's
   mark: a clock comparison, no statement, upkeep only when less than one
   partition is left).
   A head that outruns all of them by a whole partition width (a million
   changesets by default) is what it takes for a write to fail.
2. Writers are not blocked: a partition is made as a plain table (``LIKE`` the
   parent, which locks nothing writers need) and then attached, which takes
   SHARE UPDATE EXCLUSIVE on the parent (writers' ROW EXCLUSIVE does not
   conflict). A revision partition's foreign key points at the changeset
   partition of its range, new and unused too (:func:`_revision_keys`). Each
   attach runs with ``lock_timeout`` (``LOCK_TIMEOUT_MS``) and is retried, so
   a writer queued behind it would wait at most that long. A cut's detach is
   ``CONCURRENTLY`` (:func:`detach`), which no writer waits on.
3. Bounds come from the catalog, never from the setting: a partition's range
   is ``[lower, upper)``, new ones start at the last one's upper bound (or fill
   a gap), so changing the width later only changes the partitions made next.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.utils import IntegrityError, OperationalError, ProgrammingError

from atlas import conf

PARENT = "changesets_revision"
CHANGESETS = "changesets_changeset"
# The tables partitioned by seq, with the same bounds (migration 0038 lays the
# changeset table out on the revision table's): referenced first, so upkeep makes
# a changeset partition before the revision partition whose rows point into it.
PARENTS = (CHANGESETS, PARENT)
# How long an attach or detach may make a writer wait, and for how long it tries again
# (each try under the timeout; pauses grow to a second, with jitter, so a try lands
# in a gap between writers' transactions).
LOCK_TIMEOUT_MS = 50
# ``DETACH … CONCURRENTLY`` takes only SHARE UPDATE EXCLUSIVE on the parent (writers do
# not conflict), then waits for transactions that may still see the partition: it
# may wait long without holding anyone up.
CONCURRENT_LOCK_TIMEOUT_MS = 60_000
RETRY_SECONDS = 300.0
RETRY_PAUSE_SECONDS = 0.05
# The cheap check reads the head at most this often per process.
CHECK_EVERY_SECONDS = 5.0

# Another process made the partition first: "already exists" (or its catalog row's
# unique key, when both create at once), "would overlap".
_RACED = {"42P07", "42P17", "23505"}

_BOUND = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")


class UpkeepFailed(Exception):
    """A partition could not be attached or detached within its attempts."""


@dataclass(frozen=True)
class Partition:
    """One partition: seqs ``lower <= seq < upper``."""

    name: str
    lower: int
    upper: int
    # The table's oid where read from the catalog (else 0): a partition made
    # again under the same name is another table.
    oid: int = field(default=0, compare=False)

    @property
    def last_seq(self) -> int:
        return self.upper - 1


def partition_name(lower: int, parent: str = PARENT) -> str:
    return f"{parent}_p{lower:012d}"


def is_partitioned(cursor: Any | None = None, parent: str = PARENT) -> bool:
    """Whether ``parent`` is partitioned (revisions from migration 0025 on, changesets 0038)."""
    return _fetch(
        cursor,
        "SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)",
        [parent],
    ) == [(True,)]


def partitioned_parents(cursor: Any | None = None) -> list[str]:
    """Those of :data:`PARENTS` that are partitioned, referenced first."""
    return [parent for parent in PARENTS if is_partitioned(cursor, parent)]


def partitions(cursor: Any | None = None, parent: str = PARENT) -> list[Partition]:
    """``parent``'s attached partitions, in seq order (empty when it is not partitioned)."""
    rows = _fetch(
        cursor,
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), c.oid::int8 FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
        [parent],
    )
    found = []
    for name, bound, oid in rows:
        match = _BOUND.search(bound or "")
        if match:  # (a DEFAULT partition has no range; Atlas never makes one)
            found.append(Partition(name, int(match.group(1)), int(match.group(2)), int(oid)))
    return sorted(found, key=lambda p: p.lower)


def log_head(cursor: Any | None = None) -> int:
    rows = _fetch(cursor, "SELECT seq FROM changesets_loghead WHERE id = 1", [])
    return int(rows[0][0]) if rows else 0


def width() -> int:
    return max(int(conf.get("ATLAS_LOG_PARTITION_SEQS")), 1)


def ahead() -> int:
    return max(int(conf.get("ATLAS_LOG_PARTITIONS_AHEAD")), 1)


def missing(
    lo: int, hi: int, existing: list[Partition], *, step: int | None = None
) -> list[tuple[int, int]]:
    """The ``[lower, upper)`` ranges to make so that seqs ``lo..hi-1`` are all covered.

    New ranges are ``step`` wide from the end of the partition before them, and
    stop at the next one's lower bound (a gap is filled exactly).
    """
    step = step or width()
    out: list[tuple[int, int]] = []
    seq = lo
    ordered = sorted(existing, key=lambda p: p.lower)
    while seq < hi:
        covering = next((p for p in ordered if p.lower <= seq < p.upper), None)
        if covering is not None:
            seq = covering.upper
            continue
        base = max((p.upper for p in ordered if p.upper <= seq), default=0)
        start = base + (seq - base) // step * step
        end = min([start + step, *(p.lower for p in ordered if p.lower > seq)])
        out.append((start, end))
        ordered.append(Partition(partition_name(start), start, end))
        seq = end
    return out


def ensure_covering(lo: int, hi: int, *, lock_timeout: bool = True) -> list[Partition]:
    """Make the partitions seqs ``lo..hi-1`` still lack, in each partitioned parent; those made.

    ``lock_timeout=False`` only inside a migration (nothing else runs then, and
    the whole migration is one transaction). Both parents start from the same
    bounds and :func:`missing` is a function of them, so they stay alike.
    """
    made = []
    for _ in range(10):  # another process making the same partitions: look again
        try:
            for parent in partitioned_parents():
                for lower, upper in missing(max(lo, 0), hi, partitions(parent=parent)):
                    made.append(attach(parent, lower, upper, lock_timeout=lock_timeout))
            break
        except (ProgrammingError, OperationalError, IntegrityError) as exc:
            if getattr(exc.__cause__, "sqlstate", None) not in _RACED:
                raise
    if made:
        forget()
    return made


def ensure_ahead(*, lock_timeout: bool = True) -> list[Partition]:
    """Upkeep: partitions from the head's next seq to ``ahead`` widths past it."""
    head = log_head()
    return ensure_covering(head + 1, head + 1 + ahead() * width(), lock_timeout=lock_timeout)


def attach(parent: str, lower: int, upper: int, *, lock_timeout: bool) -> Partition:
    """Make partition ``[lower, upper)`` of ``parent`` and attach it (revision partitions
    keyed to their changeset partition); ``lock_timeout=False`` only where nothing else runs."""
    name = partition_name(lower, parent)
    statements = [
        # Statistics too: the planner estimates each partition's scan from the
        # partition's own (the changeset table's namespace statistics, migration 0037).
        f"CREATE TABLE {name} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
        " INCLUDING STORAGE INCLUDING COMPRESSION INCLUDING STATISTICS)",
        # The bound as a constraint, so the attach has nothing to scan (and it is dropped
        # afterwards: the partition bound says the same). A plain CREATE: a table of that
        # name left detached by a crashed cut must never be attached again.
        f"ALTER TABLE {name} ADD CONSTRAINT {name}_range CHECK (seq >= {lower} AND seq < {upper})",
        f"ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES FROM ({lower}) TO ({upper})",
        f"ALTER TABLE {name} DROP CONSTRAINT {name}_range",
    ]
    if parent == PARENT:
        statements += _revision_keys([Partition(name, lower, upper)])
    run_with_lock_timeout(statements, enabled=lock_timeout)
    return Partition(name, lower, upper)


# A revision partition's foreign key to the changeset partition that holds its seqs.
REVISION_KEY = "revision_changeset_seq"


def _revision_keys(parts: list[Partition], cursor: Any | None = None) -> list[str]:
    """``ADD CONSTRAINT`` statements: each of ``parts`` (revision partitions) keyed by
    ``seq`` to the changeset partition that holds its range (none: not partitioned).

    Why a key per partition and none on the parent (migration 0038): a key on the
    parent pointing at the partitioned changeset table makes detaching a changeset
    partition check it under a SHARE lock on the revision table, which every writer
    waits on (and, taken while writers hold theirs, deadlocks with them). Keyed
    partition to partition, a cut drops the revision partition (and its key) first,
    and the changeset partition is then referenced by nothing. New revision
    partitions are empty, so the key's validation reads nothing.
    """
    if not is_partitioned(cursor, CHANGESETS):
        return []
    holders = partitions(cursor, parent=CHANGESETS)
    out = []
    for part in parts:
        holder = next((h for h in holders if h.lower <= part.lower and part.upper <= h.upper), None)
        if holder is None:
            raise RuntimeError(f"no changeset partition holds seqs [{part.lower}, {part.upper})")
        out.append(
            f"ALTER TABLE {part.name} ADD CONSTRAINT {REVISION_KEY} FOREIGN KEY (seq)"
            f" REFERENCES {holder.name} (seq) DEFERRABLE INITIALLY DEFERRED"
        )
    return out


def key_revisions(cursor: Any) -> int:
    """Give every revision partition without one its key to its changeset partition
    (migration 0038, and a revision table moved onto partitions after it); keys made."""
    cursor.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = to_regclass(%s) AND NOT EXISTS (SELECT 1 FROM pg_constraint k"
        " WHERE k.conrelid = c.oid AND k.conname = %s)",
        [PARENT, REVISION_KEY],
    )
    bare = {row[0] for row in cursor.fetchall()}
    statements = _revision_keys([p for p in partitions(cursor) if p.name in bare], cursor)
    for statement in statements:
        cursor.execute(statement)
    return len(statements)


def run_with_lock_timeout(statements: list[str], *, enabled: bool = True) -> int:
    """Run ``statements`` in one transaction under ``lock_timeout``, retried; attempts used.

    A statement waiting for a lock makes every later locker wait behind it, so the
    wait is bounded (``LOCK_TIMEOUT_MS``) and the whole transaction tried again
    after a growing, jittered pause, for up to ``RETRY_SECONDS``.
    """
    nested = connection.in_atomic_block
    deadline = time.monotonic() + RETRY_SECONDS
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if nested:
                    # Inside a caller's transaction (tests, a migration), rows it wrote may
                    # have deferred foreign-key checks pending, which a DDL statement on
                    # their table refuses to run over: check them now.
                    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
                if enabled:
                    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'")
                for statement in statements:
                    cursor.execute(statement)
                if enabled:
                    cursor.execute("SET LOCAL lock_timeout = DEFAULT")
            return attempt
        except OperationalError as exc:
            if not enabled or getattr(exc.__cause__, "sqlstate", None) != "55P03":
                raise
            pause = min(RETRY_PAUSE_SECONDS * 2 ** min(attempt, 5), 1.0)
            time.sleep(pause * random.uniform(0.5, 1.5))
    raise UpkeepFailed(f"could not take the locks for {statements[-1][:80]!r}")


def pending(name: str) -> bool:
    """Whether partition ``name`` is half detached (a ``CONCURRENTLY`` that was stopped)."""
    rows = _fetch(
        None, "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass(%s)", [name]
    )
    return rows == [(True,)]


def detach(name: str, parent: str = PARENT) -> None:
    """Detach partition ``name`` without making writers wait on the parent.

    ``DETACH PARTITION … CONCURRENTLY`` (allowed because there is no DEFAULT
    partition): SHARE UPDATE EXCLUSIVE on the parent, which inserts and reads do
    not conflict with, then a wait for transactions that may still read the
    partition (they queue behind nothing). Stopped half way (a timeout, a crash),
    the partition stays "detach pending", and the next call finishes it
    (``FINALIZE``). It cannot run inside a transaction block; there (tests, a
    migration) the plain ``DETACH`` under ``lock_timeout`` is used instead.
    """
    if connection.in_atomic_block:
        run_with_lock_timeout([f"ALTER TABLE {parent} DETACH PARTITION {name}"])
        return
    deadline = time.monotonic() + RETRY_SECONDS
    attempt = 0
    while True:
        attempt += 1
        how = "FINALIZE" if pending(name) else "CONCURRENTLY"
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"SET lock_timeout = '{CONCURRENT_LOCK_TIMEOUT_MS}ms'")
                try:
                    cursor.execute(f"ALTER TABLE {parent} DETACH PARTITION {name} {how}")
                finally:
                    cursor.execute("RESET lock_timeout")
            return
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "55P03":
                raise
            if time.monotonic() > deadline:
                raise UpkeepFailed(f"could not detach {name}") from exc
            time.sleep(min(RETRY_PAUSE_SECONDS * 2 ** min(attempt, 5), 1.0))


# The cheap check (step 1 of the module docstring): per process.
_covered_upper: int | None = None
_checked_at = 0.0


def forget() -> None:
    """Drop this process's cached view of the partitions (after making or dropping one)."""
    global _covered_upper, _checked_at
    _covered_upper, _checked_at = None, 0.0


def check_headroom(*, seq: int | None = None, now: float | None = None) -> list[Partition]:
    """Run upkeep when less than one partition width is left past the head; cheap otherwise.

    ``seq`` is a committed seq the caller has (the journal relay's mark), else the
    head is read; at most every ``CHECK_EVERY_SECONDS``, and the catalog only when
    the cached upper bound is unknown or about to be reached.
    """
    global _covered_upper, _checked_at
    now = time.monotonic() if now is None else now
    if now - _checked_at < CHECK_EVERY_SECONDS:
        return []
    _checked_at = now
    head = log_head() if seq is None else seq
    if _covered_upper is None:
        _covered_upper = _upper()
        if _covered_upper is None:
            return []  # not partitioned
    if head + width() < _covered_upper:
        return []
    made = ensure_ahead()
    _covered_upper, _checked_at = _upper(), now
    return made


def _upper() -> int | None:
    """The first seq some partitioned parent has no partition for (None: none is partitioned)."""
    uppers = [parts[-1].upper for p in partitioned_parents() if (parts := partitions(parent=p))]
    return min(uppers) if uppers else None


def headroom() -> int | None:
    """Seqs left before a write would find no partition (None: not partitioned)."""
    upper = _upper()
    if upper is None:
        return None
    return upper - 1 - log_head()


def _fetch(cursor: Any | None, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    if cursor is not None:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
    with connection.cursor() as own:
        own.execute(sql, params)
        return list(own.fetchall())
