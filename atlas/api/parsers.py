"""JSON parsing with Atlas's body limit (413) and strict JSON (400)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from atlas.exceptions import PayloadTooLarge


def read_limited(stream: Any, parser_context: dict[str, Any] | None) -> bytes:
    """Read the body, refusing (413) more than ``ATLAS_MAX_BODY_BYTES``.

    Django's own cap would answer 400; the contract says 413.
    """
    limit = settings.ATLAS_MAX_BODY_BYTES
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


class LimitedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        raw = read_limited(stream, parser_context)
        try:
            return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ParseError(f"Malformed JSON: {exc}") from exc
