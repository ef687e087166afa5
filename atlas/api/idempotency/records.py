"""An ``Idempotency-Key``'s record: the request it stands for and the answer it keeps.

A record is created by an attempt's claim (:mod:`.locks` or :mod:`.leases`)
and ends one of three ways: it stores the response the attempt answered (so
a retry replays those bytes), it is released after a 5xx (so a retry runs
again), or it stays marked with the changeset the attempt committed (so a
retry answers 409 ``idempotency-response-lost``, never writing again).
"""

from __future__ import annotations

import hashlib
import logging
from datetime import timedelta
from typing import Any, cast
from uuid import UUID

from django.db import DatabaseError
from django.http import HttpResponse
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

from atlas import conf
from atlas.api.renderers import JSONRenderer
from atlas.exceptions import Conflict, ValidationFailed
from atlas.models import IdempotencyRecord

logger = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
# Headers that change what a request means, so they are part of "the same request".
_MEANINGFUL_HEADERS = ("If-Match", "If-None-Match", "X-Atlas-Branch", "Content-Type")
_REPLAYED_RESPONSE_HEADERS = ("ETag", "Location")

MSG_IN_PROGRESS = f"A request with this {HEADER} is still in progress."
MSG_REUSED = f"This {HEADER} was used for a different request."


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


def method(request: Request) -> str:
    # Django types ``HttpRequest.method`` Optional (a request built by hand may
    # lack one); a request that reached a view always has it.
    return cast(str, request.method)


def fingerprint(request: Request) -> str:
    """A digest of what makes two requests the same: method, path, meaningful headers, body."""
    digest = hashlib.sha256()
    digest.update(method(request).encode())
    digest.update(b"\0" + request.get_full_path().encode())
    for name in _MEANINGFUL_HEADERS:
        digest.update(b"\0" + (request.headers.get(name) or "").encode())
    digest.update(b"\0" + request._request.body)
    return digest.hexdigest()


def expired(record: IdempotencyRecord) -> bool:
    ttl = timedelta(hours=conf.get("ATLAS_IDEMPOTENCY_TTL_HOURS"))
    return record.created_at < timezone.now() - ttl


def reused() -> ValidationFailed:
    return ValidationFailed(
        MSG_REUSED, errors=[{"pointer": f"/headers/{HEADER}", "detail": "Key reused."}]
    )


def replay(record: IdempotencyRecord) -> HttpResponse:
    response = HttpResponse(
        bytes(record.response_body or b""),
        status=record.response_status,
        content_type=record.response_content_type or "application/json",
    )
    for name, value in (record.response_headers or {}).items():
        response[name] = value
    response[REPLAYED] = "true"
    return response


def release(record: IdempotencyRecord) -> None:
    """After a 5xx: free the key, unless the attempt's write committed after all."""
    try:
        IdempotencyRecord.objects.filter(pk=record.pk, changeset_id__isnull=True).delete()
    except DatabaseError:
        # The database is away; the record stays unmarked, and since our lock
        # goes with the session, a retry will find the attempt dead and run it.
        logger.warning("could not release idempotency record %s", record.pk, exc_info=True)


def store(record: IdempotencyRecord, response: Any) -> HttpResponse:
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
    first = replay(stored)
    del first[REPLAYED]
    return first
