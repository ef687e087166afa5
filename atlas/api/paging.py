"""Opaque, tamper-evident page tokens and page-size parsing.

A token is a signed position (keyset paging), never an offset, so rows
landing during a traversal cause neither duplicates nor gaps. The signature's
salt names the listing and the user, so a token forged, edited, or carried to
another listing or another user is a 400.
"""

from __future__ import annotations

from typing import Any

from django.core import signing
from rest_framework.request import Request

from atlas.exceptions import BadRequest, ValidationFailed

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def _salt(scope: str, request: Request) -> str:
    return f"atlas.page.{scope}.{getattr(request.user, 'pk', '')}"


def encode_token(scope: str, request: Request, position: dict[str, Any]) -> str:
    return signing.dumps(position, salt=_salt(scope, request), compress=True)


def decode_token(scope: str, request: Request, token: str) -> dict[str, Any]:
    try:
        value = signing.loads(token, salt=_salt(scope, request))
    except signing.BadSignature as exc:
        raise BadRequest("The page token is invalid.", pointer="/page_token") from exc
    if not isinstance(value, dict):
        raise BadRequest("The page token is invalid.", pointer="/page_token")
    return value


def int_param(request: Request, name: str, *, default: int, maximum: int, minimum: int = 1) -> int:
    """Parse a bounded integer query parameter: clamp above the maximum, 422 below 1."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValidationFailed(
            f"{name} must be an integer.",
            errors=[{"pointer": f"/{name}", "detail": "Must be an integer."}],
        ) from exc
    if value < minimum:
        raise ValidationFailed(
            f"{name} must be at least {minimum}.",
            errors=[{"pointer": f"/{name}", "detail": f"Must be at least {minimum}."}],
        )
    return min(value, maximum)


def page_size(request: Request) -> int:
    return int_param(request, "page_size", default=DEFAULT_PAGE_SIZE, maximum=MAX_PAGE_SIZE)


def page_position(scope: str, request: Request) -> dict[str, Any] | None:
    token = request.query_params.get("page_token")
    if not token:
        return None
    return decode_token(scope, request, token)


def check_known_params(request: Request, allowed: set[str]) -> None:
    """Unknown query parameters are 422: a typo'd filter must not silently list everything."""
    unknown = sorted(set(request.query_params) - allowed - {"format"})
    if unknown:
        raise ValidationFailed(
            f"Unknown query parameter(s): {', '.join(unknown)}.",
            errors=[{"pointer": f"/{name}", "detail": "Unknown parameter."} for name in unknown],
        )


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "check_known_params",
    "decode_token",
    "encode_token",
    "int_param",
    "page_position",
    "page_size",
]
