"""``Idempotency-Key`` for every mutating endpoint (API.md "Idempotency").

A retry must be able to tell three states of an earlier attempt apart, even
after that attempt's process was killed or PostgreSQL restarted under it:
*still running* (answer 409), *dead and wrote nothing* (run the request
again), *dead after its write committed* (never write again). Two pieces of
state give that answer, and both live where a crash cannot leave them wrong:

1. **Liveness is a PostgreSQL session advisory lock** on a 64-bit hash of
   (user, key), taken with ``pg_try_advisory_lock`` before the record is read
   or inserted and held until the response is stored. PostgreSQL drops it by
   itself when the session ends — process killed, connection cut, server
   restarted — so "nobody holds the lock" means "nobody is working on this
   key" without timers, heartbeats or clock comparisons. A flag or timestamp
   in the record could not do that: a dead attempt cannot clear its flag (the
   bug this replaced: a claim stuck for 24 h after a database outage), and a
   lease long enough for a write queued behind the log head would also keep a
   dead claim for that long.
2. **What was written is marked in the write's own transaction**: the
   wrapper registers a ``changesets.hooks.in_write_transaction`` callback that
   sets the record's ``changeset_id`` next to the changeset row. The mark
   commits exactly when the changeset does, so a record without a stored
   response says whether its attempt's write landed.

A retry that takes the lock and finds a record without a response therefore
knows the attempt is dead; unmarked, it deletes the record and runs the
request again; marked, it answers 409 ``idempotency-response-lost`` naming the
changeset (the response itself cannot be rebuilt generally: each endpoint
renders its own body). A retry that cannot take the lock replays a stored
response, or answers 422 for a different request, or 409 "in progress".

Why an advisory lock rather than a row lock or a second connection: the lock
lives in the request's own session, costs one round trip each way, blocks
nobody (``try``), and needs no extra connection per request. Its limits:
it needs a session of its own for the request; session locks are re-entrant,
so the wrapper also refuses a key this very connection already holds (a
nested call in one thread), and if unlocking fails it closes the connection,
so a lock can never outlive its request in a reused persistent connection
(Django's own pool resets returned connections: ``settings.reset_pooled_session``).
A hash collision between two live keys costs a spurious 409 for one of them
(odds about 2^-64 per pair).

**Under transaction pooling** (``ATLAS_DB_POOLING=transaction``: PgBouncer in
``pool_mode = transaction``, RDS Proxy) a request has no session of its own,
so liveness is a **lease on the record row** instead:

1. The claim is one statement, ``INSERT … ON CONFLICT (user, key) DO NOTHING
   RETURNING id``, with ``lease_until`` = the database's clock plus
   ``ATLAS_IDEMPOTENCY_LEASE_SECONDS``. Whoever inserts runs the request.
2. A retry that finds the row reads it with "is the lease still running" by
   the same clock: running → 409 in progress; ended and marked →
   ``idempotency-response-lost``; ended and unmarked → it deletes that row
   (``DELETE … WHERE id = … AND changeset_id IS NULL AND lease ended``, so it
   cannot delete a row whose write committed meanwhile) and claims anew.
3. An attempt that ends without storing a response (an error, the process
   going down) ends its lease at once, so a retry does not wait it out;
   only a process killed outright leaves the lease to run out.
4. **The write is fenced by its row**: the mark is an ``UPDATE … WHERE id =
   <this attempt's row>`` inside the write's transaction, and a write whose
   row is gone (a retry took over after its lease ran out) raises, rolling
   back. A slow attempt therefore never writes a second changeset: it is
   superseded and answers 409, whatever the lease length. The fence is kept
   under session locks too (it costs nothing there), which also makes
   switching ``ATLAS_DB_POOLING`` on a running deployment safe.

The price against the session lock: after a process is killed outright, a
retry answers 409 until the lease runs out, rather than at once.

Writes that are not changesets (namespaces, grants, branch create/abandon,
subscriptions) do not pass through the write hook, so for them "dead and
unmarked" cannot prove that nothing committed; a retry runs them again,
which for all but ``POST /subscriptions`` finds the state already there (or
answers as a second identical request would). docs/api.md says so.

Each attempt works on its own record row (a rerun deletes the dead one and
inserts a new one), and every later statement names the row by primary key,
so a stale attempt whose session died can never touch a newer attempt's row.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast
from uuid import UUID

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now
from django.http import HttpResponse
from django.utils import timezone
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from atlas import conf
from atlas.api.auth import actor
from atlas.api.errors import problem_exception_handler, problem_for
from atlas.exceptions import Conflict, ValidationFailed
from atlas.models import IdempotencyRecord
from changesets.hooks import in_write_transaction

logger = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
# Headers that change what a request means, so they are part of "the same request".
_MEANINGFUL_HEADERS = ("If-Match", "If-None-Match", "X-Atlas-Branch", "Content-Type")
_REPLAYED_RESPONSE_HEADERS = ("ETag", "Location")
# Advisory locks this process holds through a connection (see the module docstring).
_HELD_ATTRIBUTE = "_atlas_idempotency_locks"

MSG_IN_PROGRESS = f"A request with this {HEADER} is still in progress."
MSG_REUSED = f"This {HEADER} was used for a different request."
MSG_SUPERSEDED = (
    f"This request took longer than its {HEADER} lease, and a retry of it took over;"
    " nothing was written by this one. Retry to read the key's answer."
)
# Rounds of "claim, else find the earlier attempt dead and remove it" before 409.
_LEASE_CLAIM_ROUNDS = 3


class ResponseLost(Conflict):
    """The key's request committed a changeset, but its response was never stored."""

    type, title = "idempotency-response-lost", "Response lost"

    def __init__(self, changeset_id: UUID) -> None:
        super().__init__(
            f"The request with this {HEADER} was applied as changeset {changeset_id}, but the"
            " server stopped before its response was stored. It will not be applied again;"
            f" read GET /api/v1/changesets/{changeset_id} for what it did."
        )
        self.changeset_id = changeset_id

    def as_problem(self) -> dict[str, Any]:
        return {**super().as_problem(), "changeset_id": str(self.changeset_id)}


def _method(request: Request) -> str:
    # Django types ``HttpRequest.method`` Optional (a request built by hand may
    # lack one); a request that reached a view always has it.
    return cast(str, request.method)


def _fingerprint(request: Request) -> str:
    digest = hashlib.sha256()
    digest.update(_method(request).encode())
    digest.update(b"\0" + request.get_full_path().encode())
    for name in _MEANINGFUL_HEADERS:
        digest.update(b"\0" + (request.headers.get(name) or "").encode())
    digest.update(b"\0" + request._request.body)
    return digest.hexdigest()


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


def _try_lock(lock: int) -> bool:
    if lock in _held():  # re-entrant in PostgreSQL: our own session would get it again
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [lock])
        taken = bool(cursor.fetchone()[0])
    if taken:
        _held().add(lock)
    return taken


def _unlock(lock: int) -> None:
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


def _expired(record: IdempotencyRecord) -> bool:
    ttl = timedelta(hours=conf.get("ATLAS_IDEMPOTENCY_TTL_HOURS"))
    return record.created_at < timezone.now() - ttl


def _reused() -> ValidationFailed:
    return ValidationFailed(
        MSG_REUSED, errors=[{"pointer": f"/headers/{HEADER}", "detail": "Key reused."}]
    )


def _replay(record: IdempotencyRecord) -> HttpResponse:
    response = HttpResponse(
        bytes(record.response_body or b""),
        status=record.response_status,
        content_type=record.response_content_type or "application/json",
    )
    for name, value in (record.response_headers or {}).items():
        response[name] = value
    response[REPLAYED] = "true"
    return response


def _busy(request: Request, key: str, fingerprint: str) -> HttpResponse:
    """Another session holds the key: replay a stored answer, or refuse."""
    record = IdempotencyRecord.objects.filter(user=actor(request), key=key).first()
    if record is not None and not _expired(record):
        if record.fingerprint != fingerprint:
            raise _reused()
        if record.response_status is not None:
            return _replay(record)
    raise Conflict(MSG_IN_PROGRESS)


def _claim(request: Request, key: str, fingerprint: str) -> IdempotencyRecord | HttpResponse:
    """Under the key's lock: a new record for this attempt, or the earlier answer."""
    record = IdempotencyRecord.objects.filter(user=actor(request), key=key).first()
    if record is not None and _expired(record):
        IdempotencyRecord.objects.filter(pk=record.pk).delete()
        record = None
    if record is not None:
        if record.fingerprint != fingerprint:
            raise _reused()
        if record.response_status is not None:
            return _replay(record)
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
                method=_method(request),
                path=request.get_full_path(),
            )
    except IntegrityError:
        # Inserted by a process that does not take the lock (an older release
        # during a rolling deploy): treat it as running.
        raise Conflict(MSG_IN_PROGRESS) from None


def _release(record: IdempotencyRecord) -> None:
    """After a 5xx: free the key, unless the attempt's write committed after all."""
    try:
        IdempotencyRecord.objects.filter(pk=record.pk, changeset_id__isnull=True).delete()
    except DatabaseError:
        # The database is away; the record stays unmarked, and since our lock
        # goes with the session, a retry will find the attempt dead and run it.
        logger.warning("could not release idempotency record %s", record.pk, exc_info=True)


def _store(record: IdempotencyRecord, response: Any) -> HttpResponse:
    """Store the response as the bytes a replay will send, and answer with them."""
    body = (
        JSONRenderer().render(response.data) if isinstance(response, Response) else response.content
    )
    # An unrendered DRF Response still carries HttpResponse's default
    # "text/html" header; its real type is the JSON renderer's.
    content_type = (
        (response.content_type or JSONRenderer.media_type)
        if isinstance(response, Response)
        else response.get("Content-Type", JSONRenderer.media_type)
    )
    headers = {h: response[h] for h in _REPLAYED_RESPONSE_HEADERS if response.has_header(h)}
    IdempotencyRecord.objects.filter(pk=record.pk).update(
        response_status=response.status_code,
        response_body=body,
        response_content_type=content_type,
        response_headers=headers,
        lease_until=None,
    )
    stored = IdempotencyRecord(
        response_status=response.status_code,
        response_body=body,
        response_content_type=content_type,
        response_headers=headers,
    )
    first = _replay(stored)
    del first[REPLAYED]
    return first


def _run(
    handler: Callable[..., Any],
    record: IdempotencyRecord,
    view: Any,
    request: Request,
    *args: Any,
    **kwargs: Any,
) -> Any:
    def mark(changeset: Any) -> None:
        # The fence: this attempt's row is gone only if a retry took over (its
        # lease ran out); raising here rolls this write back.
        if not IdempotencyRecord.objects.filter(pk=record.pk).update(changeset_id=changeset.id):
            raise Conflict(MSG_SUPERSEDED)

    try:
        with in_write_transaction(mark):
            response = handler(view, request, *args, **kwargs)
    except Exception as exc:
        error = problem_for(exc)
        if error is None or error.status >= 500:
            _release(record)
            raise
        response = problem_exception_handler(exc, {"request": request, "view": view})
    if response.status_code >= 500:
        _release(record)
        return response
    return _store(record, response)


def idempotent(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a DRF view method (post/put/patch/delete) with Idempotency-Key handling."""

    @functools.wraps(handler)
    def wrapper(view: Any, request: Request, *args: Any, **kwargs: Any) -> Any:
        key = request.headers.get(HEADER)
        if key is None:
            return handler(view, request, *args, **kwargs)
        if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
            raise ValidationFailed(
                f"{HEADER} must be 1-{MAX_KEY_LENGTH} printable characters.",
                errors=[{"pointer": f"/headers/{HEADER}", "detail": "Invalid key."}],
            )
        fingerprint = _fingerprint(request)
        if conf.get("ATLAS_DB_POOLING") == "transaction":
            return _leased(handler, view, request, key, fingerprint, *args, **kwargs)
        lock = lock_id(request.user.pk, key)
        if not _try_lock(lock):
            return _busy(request, key, fingerprint)
        try:
            claimed = _claim(request, key, fingerprint)
            if isinstance(claimed, HttpResponse):
                return claimed
            return _run(handler, claimed, view, request, *args, **kwargs)
        finally:
            _unlock(lock)

    return wrapper


# --- leases, under transaction pooling (the module docstring's second part) ----------

_CLAIM_SQL = (
    "INSERT INTO {table} (user_id, key, fingerprint, method, path, created_at,"
    " response_content_type, response_headers, lease_until)"
    " VALUES (%s, %s, %s, %s, %s, statement_timestamp(), '', '{{}}',"
    " statement_timestamp() + make_interval(secs => %s))"
    " ON CONFLICT (user_id, key) DO NOTHING RETURNING id"
)


def _insert_claim(request: Request, key: str, fingerprint: str) -> IdempotencyRecord | None:
    """This attempt's new row with a running lease, or None when the key has a row."""
    table = IdempotencyRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            _CLAIM_SQL.format(table=connection.ops.quote_name(table)),
            [
                actor(request).pk,
                key,
                fingerprint,
                _method(request),
                request.get_full_path(),
                conf.get("ATLAS_IDEMPOTENCY_LEASE_SECONDS"),
            ],
        )
        row = cursor.fetchone()
    return None if row is None else IdempotencyRecord(pk=row[0])


def _lease_ended() -> Q:
    # Null: a record made under session locks (ATLAS_DB_POOLING switched on a
    # running deployment); its write is fenced all the same, so it counts as ended.
    return Q(lease_until__isnull=True) | Q(lease_until__lte=Now())


def _claim_lease(request: Request, key: str, fingerprint: str) -> IdempotencyRecord | HttpResponse:
    """A new record with a running lease for this attempt, or the earlier answer.

    1. Insert the claim; done if it went in.
    2. Else read the key's row, with whether its lease still runs (database clock).
    3. Expired (TTL), or dead with nothing written: remove it by id, conditionally,
       and go round again. Otherwise answer from it: 422, replay, 409 or 409 lost.
    """
    for _ in range(_LEASE_CLAIM_ROUNDS):
        claimed = _insert_claim(request, key, fingerprint)
        if claimed is not None:
            return claimed
        live = ExpressionWrapper(Q(lease_until__gt=Now()), output_field=BooleanField())
        record = (
            IdempotencyRecord.objects.filter(user=actor(request), key=key)
            .annotate(live=live)
            .first()
        )
        if record is None:
            continue  # removed since the insert: claim again
        if _expired(record):
            IdempotencyRecord.objects.filter(pk=record.pk).delete()
            continue
        if record.fingerprint != fingerprint:
            raise _reused()
        if record.response_status is not None:
            return _replay(record)
        if record.live:  # the annotation above
            raise Conflict(MSG_IN_PROGRESS)
        if record.changeset_id is not None:
            raise ResponseLost(record.changeset_id)
        # Dead, and (when the delete matches) its write never committed: run anew.
        IdempotencyRecord.objects.filter(
            _lease_ended(),
            pk=record.pk,
            changeset_id__isnull=True,
            response_status__isnull=True,
        ).delete()
    raise Conflict(MSG_IN_PROGRESS)


def _end_lease(record: IdempotencyRecord) -> None:
    """The attempt is over without a stored response: let a retry decide now."""
    try:
        IdempotencyRecord.objects.filter(pk=record.pk, response_status__isnull=True).update(
            lease_until=Now()
        )
    except DatabaseError:
        # The database is away; the lease runs out by itself.
        logger.warning("could not end idempotency lease %s", record.pk, exc_info=True)


def _leased(
    handler: Callable[..., Any],
    view: Any,
    request: Request,
    key: str,
    fingerprint: str,
    *args: Any,
    **kwargs: Any,
) -> Any:
    claimed = _claim_lease(request, key, fingerprint)
    if isinstance(claimed, HttpResponse):
        return claimed
    stored = False
    try:
        response = _run(handler, claimed, view, request, *args, **kwargs)
        stored = response.status_code < 500  # else _run released (or kept) the record
        return response
    finally:
        if not stored:
            _end_lease(claimed)
