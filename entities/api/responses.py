"""What every single-entity write answers: ``{"entity", "changeset", "status"}``.

Shared by the entity viewset (PUT, PATCH, DELETE), restore and the bulk
endpoints (their changeset), so none of them imports another's view module.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from atlas.api.conditional import etag
from atlas.api.representations import ChangesetSerializer, changeset_repr
from changesets.services.apply import ApplyResult
from entities.api import serializers as s
from entities.store import EntityKey

WRITE_STATUSES = ["created", "updated", "deleted", "unchanged"]
WRITE_ERRORS = (400, 403, 404, 409, 412, 413, 415, 422)

WriteResponseSerializer = inline_serializer(
    "EntityWriteResponse",
    {
        "entity": s.EntitySerializer(allow_null=True),
        "changeset": ChangesetSerializer(allow_null=True),
        "status": serializers.ChoiceField(WRITE_STATUSES),
    },
)


def changeset_or_none(result: ApplyResult) -> dict[str, Any] | None:
    return changeset_repr(result.changeset, result.revisions) if result.changeset else None


def write_body(result: ApplyResult, key: EntityKey) -> dict[str, Any]:
    """The write answer's body: the entity after the write (null when absent), the
    changeset (null when nothing changed) and the last op's status word."""
    entity = result.entities.get(key)
    return {
        "entity": s.entity_repr(entity) if entity is not None else None,
        "changeset": changeset_or_none(result),
        "status": result.results[-1].status if result.results else "unchanged",
    }


def write_response(result: ApplyResult, key: EntityKey) -> Response:
    body = write_body(result, key)
    response = Response(body, status=201 if body["status"] == "created" else 200)
    entity = result.entities.get(key)
    if entity is not None:
        response["ETag"] = etag(entity.version)
    return response
