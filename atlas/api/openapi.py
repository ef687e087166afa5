"""OpenAPI pieces every app's API describes the same way: headers, paging, errors.

One definition each, so a header documented on an entity write reads the same
on a revert or a merge.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

from atlas.api.branch import BRANCH_HEADER
from atlas.api.inputs import KIND_SCHEMA, NAMESPACE_SCHEMA

# Every error is RFC 9457 problem+json (atlas.api.errors renders it).
PROBLEM = OpenApiTypes.OBJECT

BRANCH_PARAM = OpenApiParameter(
    BRANCH_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Branch to read or write; absent = baseline. Unknown or invisible → 404.",
)
IDEMPOTENCY_PARAM = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Replays the first response for the same principal, key and request.",
)
# Described in words, not as a JSON Schema ``pattern``: Schemathesis 4.32's
# coverage phase cannot draw from this grammar and sends schema-invalid values
# (``0``) as positive data.
IF_MATCH_PARAM = OpenApiParameter(
    "If-Match",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description='"<v>", W/"<v>", a list of them (matches when any does), or *;'
    " anything else is 422 (malformed If-Match).",
)
IF_NONE_MATCH_PARAM = OpenApiParameter(
    "If-None-Match",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="An ETag (or a list of them, or *): 304 when it still matches.",
)
IF_NONE_MATCH_PUT_PARAM = OpenApiParameter(
    "If-None-Match",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    enum=["*"],
    description="* means create-only (412 when the entity exists); nothing else is accepted.",
)
PAGE_PARAMS = [
    OpenApiParameter("page_size", OpenApiTypes.INT, description="Default 50, max 500."),
    OpenApiParameter("page_token", OpenApiTypes.STR, description="Opaque; from next_page_token."),
]
AS_OF_PARAMS = [
    OpenApiParameter(
        "as_of",
        OpenApiTypes.UUID,
        description="Read the baseline as it stood right after this changeset.",
    ),
    OpenApiParameter(
        "as_of_time",
        OpenApiTypes.DATETIME,
        description="Read the baseline as of the newest changeset at or before this time.",
    ),
]

__all__ = [
    "AS_OF_PARAMS",
    "BRANCH_PARAM",
    "IDEMPOTENCY_PARAM",
    "IF_MATCH_PARAM",
    "IF_NONE_MATCH_PARAM",
    "IF_NONE_MATCH_PUT_PARAM",
    "KIND_SCHEMA",
    "NAMESPACE_SCHEMA",
    "PAGE_PARAMS",
    "PROBLEM",
]
