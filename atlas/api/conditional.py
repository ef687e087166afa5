"""Preconditions (``If-Match``, ``If-None-Match``) in headers and in batch ops."""

from __future__ import annotations

import re
from typing import Any

from rest_framework.request import Request

from atlas.api.inputs import Errors
from atlas.exceptions import ValidationFailed
from changesets.ops import IfMatch

# ``If-Match`` (RFC 9110 13.1.1): ``*``, or a list of entity tags, which for
# Atlas are ``"<version>"`` or ``W/"<version>"`` (a version is a canonical
# non-negative integer). A list may hold empty elements and whitespace
# (RFC 9110 5.6.1).
_OWS = r"[ \t]*"
_ETAG = r'(?:W/)?"(?:0|[1-9][0-9]*)"'
IF_MATCH_PATTERN = rf"^{_OWS}(?:\*|(?:,{_OWS})*{_ETAG}(?:{_OWS},(?:{_OWS}{_ETAG})?)*){_OWS}$"
_IF_MATCH_RE = re.compile(IF_MATCH_PATTERN)
_ETAG_VERSION_RE = re.compile(r'"([0-9]+)"')
MSG_IF_MATCH = (
    'Malformed If-Match: expected * or a list of quoted entity tags such as "3" or W/"3".'
)
MSG_IF_MATCH_VALUE = 'Must be a positive integer version or "*".'


def etag(version: int) -> str:
    return f'"{version}"'


def parse_if_match_header(request: Request) -> IfMatch:
    """``If-Match``: ``*``, or a list of ``"<v>"`` / ``W/"<v>"`` that matches when any does.

    Anything else (``1``, ``"abc"``, an empty value) is malformed: 422 with the
    pointer ``/headers/If-Match``, never a 412 about a version nobody sent.
    """
    raw = request.headers.get("If-Match")
    if raw is None:
        return None
    if not _IF_MATCH_RE.fullmatch(raw):
        raise ValidationFailed(
            MSG_IF_MATCH,
            pointer="/headers/If-Match",
            errors=[{"pointer": "/headers/If-Match", "detail": MSG_IF_MATCH}],
        )
    if raw.strip(" \t") == "*":
        return "*"
    versions = tuple(int(v) for v in _ETAG_VERSION_RE.findall(raw))
    return versions[0] if len(versions) == 1 else versions


def parse_if_none_match_put(request: Request) -> bool:
    raw = request.headers.get("If-None-Match")
    if raw is None:
        return False
    if raw.strip() != "*":
        raise ValidationFailed(
            'On writes, If-None-Match supports only "*" (create-only).',
            errors=[{"pointer": "/headers/If-None-Match", "detail": 'Only "*".'}],
        )
    return True


def if_none_match_hits(request: Request, tag: str) -> bool:
    """A read's ``If-None-Match`` names ``tag`` (or is ``*``): answer 304."""
    inm = request.headers.get("If-None-Match")
    if not inm:
        return False
    return inm.strip() == "*" or tag in [t.strip().removeprefix("W/") for t in inm.split(",")]


def if_match_error(value: Any) -> str | None:
    """Why ``value`` is not an op's ``if_match`` (absent/null is fine), or None."""
    if value is None or value == "*":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return MSG_IF_MATCH_VALUE
    return None


def parse_if_match(value: Any, errors: Errors, pointer: str) -> IfMatch:
    error = if_match_error(value)
    if error is not None:
        errors.add(pointer, error)
        return None
    return value
