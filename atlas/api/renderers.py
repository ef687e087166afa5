"""JSON responses encoded by orjson, with DRF's rules.

DRF's ``JSONRenderer`` encodes with the standard library: 4.3 ms of a
1,000-record feed page, 0.9 ms of a 500-entity page. orjson takes a quarter
of that or less (``bench/renderers.py``, docs/benchmarks.md). For what
Atlas's views return (dicts, lists, strings, 64-bit integers, floats, None,
UUIDs; timestamps already rendered as RFC 3339 text) the bytes are DRF's,
with one exception: orjson spells a float below 1e-4 without Python's padded
exponent (``1.5e-7`` where DRF writes ``1.5e-07``, ``0.00001`` for
``1e-05``), the same number to every JSON parser. (DRF refuses non-finite
floats, which orjson would write as ``null``; none reaches a response:
content refuses them, 422.)

Everything else orjson would write differently goes to DRF: datetimes, dates,
times and dataclasses through DRF's encoder (``default``); and the whole body
through DRF's renderer when orjson refuses it (integers beyond 64 bits, keys that
are not strings) or when the client asks for an indent or the settings for
ASCII-only or non-compact output. As DRF does, U+2028 and U+2029 are escaped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from rest_framework import renderers

_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_LINE_SEPARATOR = "\u2028".encode()
_PARAGRAPH_SEPARATOR = "\u2029".encode()


class JSONRenderer(renderers.JSONRenderer):
    """DRF's ``JSONRenderer``, encoding with orjson where the result is DRF's."""

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if data is None:
            return b""
        context = renderer_context or {}
        if (
            self.ensure_ascii
            or not self.compact
            or self.get_indent(accepted_media_type or "", context) is not None
        ):
            return super().render(data, accepted_media_type, context)
        try:
            body = orjson.dumps(data, default=self.encoder_class().default, option=_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError: a big integer, a key not a string, …
            return super().render(data, accepted_media_type, context)
        return body.replace(_LINE_SEPARATOR, b"\\u2028").replace(_PARAGRAPH_SEPARATOR, b"\\u2029")
