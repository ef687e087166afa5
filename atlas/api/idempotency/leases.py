"""Liveness by a lease on the record row, under transaction pooling (the package
docstring's second part).

Behind PgBouncer in transaction mode or RDS Proxy a request has no session of
its own to hold an advisory lock, so the record itself says whether its
attempt still runs: ``lease_until``, set and compared by the database's clock.
The write stays fenced by the row (the package's wrapper), so a lease that runs out
under a slow attempt costs that attempt a 409, never a second changeset.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now
from django.http import HttpResponse
from rest_framework.request import Request

from atlas import conf
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

# Rounds of "claim, else find the earlier attempt dead and remove it" before 409.
_LEASE_CLAIM_ROUNDS = 3

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
                method(request),
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


def claim_lease(request: Request, key: str, fingerprint: str) -> IdempotencyRecord | HttpResponse:
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
        if expired(record):
            IdempotencyRecord.objects.filter(pk=record.pk).delete()
            continue
        if record.fingerprint != fingerprint:
            raise reused()
        if record.response_status is not None:
            return replay(record)
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


def end_lease(record: IdempotencyRecord) -> None:
    """The attempt is over without a stored response: let a retry decide now."""
    try:
        IdempotencyRecord.objects.filter(pk=record.pk, response_status__isnull=True).update(
            lease_until=Now()
        )
    except DatabaseError:
        # The database is away; the lease runs out by itself.
        logger.warning("could not end idempotency lease %s", record.pk, exc_info=True)
