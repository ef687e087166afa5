"""JSON parsing with Atlas's body limit (413) and strict JSON (400)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from atlas import conf
from atlas.exceptions import PayloadTooLarge, ValidationFailed


def read_limited(stream: Any, parser_context: dict[str, Any] | None) -> bytes:
    """Read the body, refusing (413) more than ``ATLAS_MAX_BODY_BYTES``.

    Django's own cap would answer 400; the contract says 413.
    """
    limit = conf.get("ATLAS_MAX_BODY_BYTES")
    request = (parser_context or {}).get("request")
    length = request.META.get("CONTENT_LENGTH") if request is not None else None
    if length and str(length).isdigit() and int(length) > limit:
        raise PayloadTooLarge(f"The request body is over the {limit}-byte limit.")
    data = stream.read(limit + 1) if stream is not None else b""
    if len(data) > limit:
        raise PayloadTooLarge(f"The request body is over the {limit}-byte limit.")
    return data


def _reject_constant(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON")


class _Unstorable(Exception):
    """Well-formed JSON holding a value PostgreSQL's jsonb (or UTF-8) cannot hold: 422."""


def _finite_float(value: str) -> float:
    number = float(value)
    if not math.isfinite(number):  # e.g. 1e400: Python reads inf, which jsonb refuses
        raise _Unstorable(f"The number {value[:40]} is out of range.")
    return number


# An escaped UTF-16 surrogate; only bodies holding one pay for the full check below.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_unicode(text: str, value: Any) -> None:
    """Refuse lone surrogates (``"\\ud800"``): they cannot be encoded as UTF-8 or stored."""
    if not _SURROGATE_ESCAPE.search(text):
        return
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _Unstorable("Strings may not contain unpaired UTF-16 surrogates.") from exc


class LimitedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        raw = read_limited(stream, parser_context)
        try:
            text = raw.decode("utf-8")
            value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
            _check_unicode(text, value)
            return value
        except _Unstorable as exc:
            raise ValidationFailed(
                str(exc), pointer="/", errors=[{"pointer": "/", "detail": str(exc)}]
            ) from exc
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ParseError(f"Malformed JSON: {exc}") from exc
