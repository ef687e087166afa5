"""``Idempotency-Key`` for every mutating endpoint (API.md "Idempotency").

1. The key is claimed by inserting a row in its own, committed transaction,
   so a concurrent retry sees it at once and answers 409 (never a second
   changeset).
2. The handler runs. A response below 500 (success, or a client error such
   as 412) is stored as rendered bytes and replayed byte for byte.
3. A 5xx or an unexpected exception releases the claim, so the client may
   retry with the same key.

Known window: a process killed between the write's commit and step 2 leaves
the claim without a response; retries get 409 until the claim ages out
(``ATLAS_IDEMPOTENCY_TTL_HOURS``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import HttpResponse
from django.utils import timezone
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api.errors import problem_exception_handler, problem_for
from atlas.exceptions import Conflict, ValidationFailed
from atlas.models import IdempotencyRecord

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
# Headers that change what a request means, so they are part of "the same request".
_MEANINGFUL_HEADERS = ("If-Match", "If-None-Match", "X-Atlas-Branch", "Content-Type")
_REPLAYED_RESPONSE_HEADERS = ("ETag", "Location")


def _fingerprint(request: Request) -> str:
    digest = hashlib.sha256()
    digest.update(request.method.encode())
    digest.update(b"\0" + request.get_full_path().encode())
    for name in _MEANINGFUL_HEADERS:
        digest.update(b"\0" + (request.headers.get(name) or "").encode())
    digest.update(b"\0" + request._request.body)
    return digest.hexdigest()


def _claim(request: Request, key: str, fingerprint: str) -> IdempotencyRecord | None:
    """Insert the claim; return the earlier record instead when the key is taken."""
    ttl = timedelta(hours=settings.ATLAS_IDEMPOTENCY_TTL_HOURS)
    for _ in range(2):
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.create(
                    user=request.user,
                    key=key,
                    fingerprint=fingerprint,
                    method=request.method,
                    path=request.get_full_path(),
                )
            return None
        except IntegrityError:
            existing = IdempotencyRecord.objects.filter(user=request.user, key=key).first()
            if existing is None:
                continue  # released between our insert and read: try again
            if existing.created_at < timezone.now() - ttl:
                IdempotencyRecord.objects.filter(pk=existing.pk).delete()
                continue
            return existing
    raise Conflict("This Idempotency-Key is being used concurrently; retry.")


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
        existing = _claim(request, key, fingerprint)
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise ValidationFailed(
                    f"This {HEADER} was used for a different request.",
                    errors=[{"pointer": f"/headers/{HEADER}", "detail": "Key reused."}],
                )
            if existing.response_status is None:
                raise Conflict(f"A request with this {HEADER} is still in progress.")
            return _replay(existing)
        try:
            response = handler(view, request, *args, **kwargs)
        except Exception as exc:
            error = problem_for(exc)
            if error is None or error.status >= 500:
                IdempotencyRecord.objects.filter(user=request.user, key=key).delete()
                raise
            response = problem_exception_handler(exc, {"request": request, "view": view})
        if response.status_code >= 500:
            IdempotencyRecord.objects.filter(user=request.user, key=key).delete()
            return response
        body = (
            JSONRenderer().render(response.data)
            if isinstance(response, Response)
            else response.content
        )
        # An unrendered DRF Response still carries HttpResponse's default
        # "text/html" header; its real type is the JSON renderer's.
        content_type = (
            (response.content_type or JSONRenderer.media_type)
            if isinstance(response, Response)
            else response.get("Content-Type", JSONRenderer.media_type)
        )
        headers = {h: response[h] for h in _REPLAYED_RESPONSE_HEADERS if response.has_header(h)}
        record = IdempotencyRecord(
            response_status=response.status_code,
            response_body=body,
            response_content_type=content_type,
            response_headers=headers,
        )
        IdempotencyRecord.objects.filter(user=request.user, key=key).update(
            response_status=record.response_status,
            response_body=body,
            response_content_type=content_type,
            response_headers=headers,
        )
        # Answer with exactly the bytes a replay will send.
        first = _replay(record)
        del first[REPLAYED]
        return first

    return wrapper
