"""When a write runs again, and whether it may first try the one-round-trip path.

A write is retried whole: after a lost create race, a deadlock or a
serialization failure, or a missing log head. Its first attempt may read
unlocked and write compare-and-set (:func:`may_write_unlocked`); every retry
locks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.db import OperationalError, connection, transaction

from changesets.hooks import has_write_hooks
from changesets.models import LogHead
from changesets.ops import WriteOp
from changesets.services.lock import Planner
from changesets.services.result import ApplyResult
from entities.store import EntityStore, KeyRaced

MAX_ATTEMPTS = 5
# PostgreSQL's codes for "try the whole transaction again".
RETRYABLE_SQLSTATES = {"40P01", "40001"}


class HeadMissing(Exception):
    """The log head's row is gone (a flushed test database); recreate it, retry."""


def attempts(once: Callable[..., ApplyResult], *, unlocked_first: bool) -> ApplyResult:
    """Run ``once`` until it returns, retrying what :func:`worth_retrying` allows.

    A retry is always locked: a row that moved once under an unlocked write may
    be busy, and a locked write cannot lose to it again.
    """
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            if attempt == 1 and unlocked_first:
                return once(unlocked=True)
            with transaction.atomic():
                return once(unlocked=False)
        except (KeyRaced, HeadMissing, OperationalError) as exc:
            if not worth_retrying(exc) or attempt == MAX_ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def may_write_unlocked(store: EntityStore, ops: Sequence[WriteOp], plan: Planner | None) -> bool:
    """Whether this write may take the one-round-trip path: read unlocked, then
    write compare-and-set in one autocommit statement that commits as it ends.

    Only a write of one key (two writes of one row each cannot deadlock on each
    other's rows; a batch's rows are locked in key order instead), with its ops
    given (a plan decides under the locks), outside any transaction (the
    caller's transaction must hold what the write locks until its COMMIT), with
    no write hooks (they run between the log statement and COMMIT), on a store
    that supports it (``EntityStore`` ``optimistic``).
    """
    return (
        plan is None
        and getattr(store, "optimistic", False)
        and not connection.in_atomic_block
        and connection.get_autocommit()  # no transaction managed by hand either
        and not has_write_hooks()
        and len({op.key for op in ops}) == 1
    )


def worth_retrying(exc: Exception) -> bool:
    """A lost create race, a deadlock or serialization failure: the whole write
    again; the retry sees the winner's row and judges its preconditions against
    it. A missing log head: recreate it first (the migration creates the row;
    a transactional test's flush removes it)."""
    if isinstance(exc, HeadMissing):
        LogHead.objects.get_or_create(id=1)
        return True
    if isinstance(exc, OperationalError):
        sqlstate = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
        return sqlstate in RETRYABLE_SQLSTATES
    return True
