"""Liveness by session advisory lock, and the claim made under it (the package
docstring's first part).

The lock is ``pg_try_advisory_lock`` on a hash of (user, key), held by the
request's own session from before its record is read until its response is
stored; PostgreSQL drops it when the session ends, however it ends. Holding
it therefore proves that the attempt which made an unanswered record is dead.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.http import HttpResponse
from rest_framework.request import Request

from atlas.api.auth import actor
from atlas.api.idempotency.records import (
    MSG_IN_PROGRESS,
    ResponseLost,
    expired,
    method,
    replay,
    reused,
)
from atlas.exceptions import Conflict
from atlas.models import IdempotencyRecord

logger = logging.getLogger(__name__)

# Advisory locks this process holds through a connection: PostgreSQL's are re-entrant,
# so a nested call in one thread must be refused here (the package docstring).
_HELD_ATTRIBUTE = "_atlas_idempotency_locks"


def lock_id(user_pk: Any, key: str) -> int:
    """The advisory lock (a signed 64-bit integer) that guards ``(user, key)``."""
    digest = hashlib.sha256(f"atlas.idempotency\0{user_pk}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _held() -> set[int]:
    held = getattr(connection, _HELD_ATTRIBUTE, None)
    if held is None:
        held = set()
        setattr(connection, _HELD_ATTRIBUTE, held)
    return held


def try_lock(lock: int) -> bool:
    """Take ``lock`` for this session if nobody holds it, this connection included."""
    if lock in _held():  # re-entrant in PostgreSQL: our own session would get it again
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [lock])
        taken = bool(cursor.fetchone()[0])
    if taken:
        _held().add(lock)
    return taken


def unlock(lock: int) -> None:
    """Release ``lock``; if that cannot be confirmed, close the connection (and the lock)."""
    _held().discard(lock)
    if connection.connection is None:
        return  # the session that held it is closed, and its lock with it
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [lock])
            released = bool(cursor.fetchone()[0])
    except DatabaseError:
        released = False
    if not released:
        # Either the session broke (its lock went with it) or this is a new session
        # after a reconnect. Closing makes sure no lock survives into the next request.
        logger.warning("idempotency lock %s not released by unlock; closing the connection", lock)
        try:
            connection.close()
        except DatabaseError:  # pragma: no cover - closing a broken connection
            logger.warning("closing the database connection failed", exc_info=True)


def busy(request: Request, key: str, fingerprint: str) -> HttpResponse:
    """Another session holds the key: replay a stored answer, or refuse."""
    record = IdempotencyRecord.objects.filter(user=actor(request), key=key).first()
    if record is not None and not expired(record):
        if record.fingerprint != fingerprint:
            raise reused()
        if record.response_status is not None:
            return replay(record)
    raise Conflict(MSG_IN_PROGRESS)


def claim(request: Request, key: str, fingerprint: str) -> IdempotencyRecord | HttpResponse:
    """Under the key's lock: a new record for this attempt, or the earlier answer."""
    record = IdempotencyRecord.objects.filter(user=actor(request), key=key).first()
    if record is not None and expired(record):
        IdempotencyRecord.objects.filter(pk=record.pk).delete()
        record = None
    if record is not None:
        if record.fingerprint != fingerprint:
            raise reused()
        if record.response_status is not None:
            return replay(record)
        if record.changeset_id is not None:
            raise ResponseLost(record.changeset_id)
        # We hold the lock, so the attempt that made this record is dead, and its
        # write never committed (no mark): run the request again, on a new row.
        IdempotencyRecord.objects.filter(pk=record.pk).delete()
    try:
        with transaction.atomic():
            return IdempotencyRecord.objects.create(
                user=actor(request),
                key=key,
                fingerprint=fingerprint,
                method=method(request),
                path=request.get_full_path(),
            )
    except IntegrityError:
        # Inserted by a process that does not take the lock (an older release
        # during a rolling deploy): treat it as running.
        raise Conflict(MSG_IN_PROGRESS) from None
