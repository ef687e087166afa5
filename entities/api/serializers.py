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
    MAX_PREFIX_LENGTH,
    NO_NUL,
    ContentField,
    NameField,
    PrefixField,
    comment_field,
    kind_field,
    metadata_field,
    namespace_field,
    prefix_error,
)
from atlas.api.keys import AsOfSerializer
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


def deleted_entity_repr(entry: Any) -> dict[str, Any]:
    """A trash entry (``changesets.selectors.restore.DeletedEntity``): what the
    delete removed, the version it removed, and who deleted it when."""
    return {
        "namespace": entry.key.namespace,
        "kind": entry.key.kind,
        "slug": entry.key.slug,
        "content": entry.content,
        "last_version": entry.last_version,
        "deleted_by": {
            "changeset_id": str(entry.changeset_id),
            "author": entry.author,
            "at": rfc3339(entry.at),
        },
    }


class DeletedBySerializer(serializers.Serializer):
    changeset_id = serializers.UUIDField()
    author = serializers.CharField()
    at = serializers.DateTimeField()


# One item of ``GET /entities``: an entity, or with ``deleted=true`` a trash entry
# (``namespace``, ``kind``, ``slug``, ``content`` as last held, ``last_version``,
# ``deleted_by``). One schema for both, so a page validates whichever it holds.
class EntityListItemSerializer(serializers.Serializer):
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    content = serializers.DictField(help_text="Trash: the content the delete removed")
    version = serializers.IntegerField(required=False, help_text="Live entities")
    created_at = serializers.DateTimeField(required=False, help_text="Live entities")
    updated_at = serializers.DateTimeField(required=False, help_text="Live entities")
    changeset_id = serializers.UUIDField(required=False, help_text="Live entities: last writer")
    last_version = serializers.IntegerField(
        required=False, help_text="Trash: the version the delete removed"
    )
    deleted_by = DeletedBySerializer(required=False, help_text="Trash: the deleting changeset")


# A page is one object ({results, next_page_token}), not a list of them.
@extend_schema_serializer(many=False)
class EntityListPageSerializer(serializers.Serializer):
    results = EntityListItemSerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)
    as_of = AsOfSerializer(required=False)


class PutBodySerializer(strict.Body):
    content = ContentField(help_text="A JSON object (no U+0000, ≤ 64 levels)")
    comment = comment_field()
    metadata = metadata_field()


class PatchBodySerializer(strict.Body):
    patch = ContentField(patch=True, help_text="RFC 7396 merge patch of content (an object)")
    comment = comment_field()
    metadata = metadata_field()


# DELETE may carry ``{"comment", "metadata"}``; no body at all is fine too.
class DeleteBodySerializer(strict.Body):
    comment = comment_field()
    metadata = metadata_field()


class DeleteByQueryBodySerializer(strict.Body):
    namespace = namespace_field()
    kind = kind_field(required=False, allow_null=True)
    slug_prefix = PrefixField()
    dry_run = strict.StrictBooleanField(required=False, default=False)
    comment = comment_field()
    metadata = metadata_field()


def _is_prefix(value: str) -> bool:
    return prefix_error(value) is None


# ``GET /entities``: the filters, in the order their errors are reported (all in one
# 422). Paging and ``as_of`` are read where they always were (``keyset_page``,
# ``pin_as_of``): after the branch header, whose 404 comes first.
class EntityListQuery(strict.Query):
    namespace = namespace_field(required=False)
    kind = kind_field(required=False)
    slug_prefix = NameField(
        valid=_is_prefix,
        message=f"At most {MAX_PREFIX_LENGTH} characters, no NUL.",
        schema={"type": "string", "maxLength": MAX_PREFIX_LENGTH, "pattern": NO_NUL},
        required=False,
    )
    deleted = strict.QueryBooleanField(
        required=False,
        help_text="true: the trash (entities whose newest revision is a delete), baseline only.",
    )
