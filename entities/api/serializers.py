"""Entity request bodies (validated and described by one serializer each) and
the shapes of entity responses.

``POST /batch`` has its own module (``entities.api.batch``): its ops are
checked by a fast loop over the same field definitions.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from atlas.api import strict
from atlas.api.inputs import (
    ContentField,
    PrefixField,
    StrictBooleanField,
    comment_field,
    is_empty_body,
    kind_field,
    namespace_field,
)
from atlas.api.render import rfc3339
from entities.store import StoredEntity


def entity_repr(entity: StoredEntity) -> dict[str, Any]:
    return {
        "namespace": entity.key.namespace,
        "kind": entity.key.kind,
        "slug": entity.key.slug,
        "content": entity.content,
        "version": entity.version,
        "created_at": rfc3339(entity.created_at),
        "updated_at": rfc3339(entity.updated_at),
        "changeset_id": str(entity.changeset_id) if entity.changeset_id else None,
    }


class EntitySerializer(serializers.Serializer):
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    content = serializers.DictField()
    version = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    changeset_id = serializers.UUIDField(help_text="The changeset that last wrote it")


# A page is one object ({results, next_page_token}), not a list of them.
@extend_schema_serializer(many=False)
class EntityPageSerializer(serializers.Serializer):
    results = EntitySerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)


class PutBodySerializer(strict.Body):
    content = ContentField(help_text="A JSON object (no U+0000, ≤ 64 levels)")
    comment = comment_field()


class PatchBodySerializer(strict.Body):
    patch = ContentField(patch=True, help_text="RFC 7396 merge patch of content (an object)")
    comment = comment_field()


# DELETE may carry ``{"comment"}``; no body at all is fine too.
class DeleteBodySerializer(strict.Body):
    comment = comment_field()

    @classmethod
    def parse(cls, data: Any) -> dict[str, Any]:
        return {} if is_empty_body(data) else super().parse(data)


class DeleteByQueryBodySerializer(strict.Body):
    namespace = namespace_field()
    kind = kind_field(required=False, allow_null=True)
    slug_prefix = PrefixField()
    dry_run = StrictBooleanField(required=False, default=False)
    comment = comment_field()
