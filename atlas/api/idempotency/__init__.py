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

Rooms, one job each:

- ``records``: the key's record: what counts as the same request (the
  fingerprint), the stored response and its replay, the answers an earlier
  attempt's record gives (422 reused, 409 ``idempotency-response-lost``);
- ``locks``: liveness by session advisory lock, and the claim made under it;
- ``leases``: liveness by a lease on the record row (transaction pooling);
- here: ``@idempotent``, which picks the claim for the deployment's pooling,
  runs the view with the write-hook mark (the fence) and stores or releases
  what it answered.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.http import HttpResponse
from rest_framework.request import Request

from atlas import conf
from atlas.api.errors import problem_exception_handler, problem_for
from atlas.api.idempotency import locks, records
from atlas.api.idempotency.leases import claim_lease
from atlas.api.idempotency.leases import end_lease as _end_lease
from atlas.api.idempotency.locks import lock_id
from atlas.api.idempotency.records import (
    HEADER,
    MAX_KEY_LENGTH,
    MSG_IN_PROGRESS,
    MSG_REUSED,
    REPLAYED,
    ResponseLost,
)
from atlas.exceptions import Conflict, ValidationFailed
from atlas.models import IdempotencyRecord
from changesets.hooks import in_write_transaction

__all__ = [
    "HEADER",
    "MAX_KEY_LENGTH",
    "MSG_IN_PROGRESS",
    "MSG_REUSED",
    "MSG_SUPERSEDED",
    "REPLAYED",
    "ResponseLost",
    "idempotent",
    "lock_id",
]

MSG_SUPERSEDED = (
    f"This request took longer than its {HEADER} lease, and a retry of it took over;"
    " nothing was written by this one. Retry to read the key's answer."
)


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
            records.release(record)
            raise
        response = problem_exception_handler(exc, {"request": request, "view": view})
    if response.status_code >= 500:
        records.release(record)
        return response
    return records.store(record, response)


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
        fingerprint = records.fingerprint(request)
        if conf.get("ATLAS_DB_POOLING") == "transaction":
            return _leased(handler, view, request, key, fingerprint, *args, **kwargs)
        lock = lock_id(request.user.pk, key)
        if not locks.try_lock(lock):
            return locks.busy(request, key, fingerprint)
        try:
            claimed = locks.claim(request, key, fingerprint)
            if isinstance(claimed, HttpResponse):
                return claimed
            return _run(handler, claimed, view, request, *args, **kwargs)
        finally:
            locks.unlock(lock)

    return wrapper


def _leased(
    handler: Callable[..., Any],
    view: Any,
    request: Request,
    key: str,
    fingerprint: str,
    *args: Any,
    **kwargs: Any,
) -> Any:
    claimed = claim_lease(request, key, fingerprint)
    if isinstance(claimed, HttpResponse):
        return claimed
    stored = False
    try:
        response = _run(handler, claimed, view, request, *args, **kwargs)
        stored = response.status_code < 500  # else _run released (or kept) the record
        return response
    finally:
        if not stored:
            # Looked up here at call time: a test stands for a process killed
            # outright by replacing it (tests/atlas/test_pooling.py).
            _end_lease(claimed)
