"""Changeset and revision representations (API.md "Representations").

Rendering is plain functions over model rows, fast enough for pages of
thousands of ops; the serializers below describe the same shapes for the
OpenAPI schema.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework import serializers

from atlas.api.render import rfc3339
from changesets.models import Changeset, Revision


def op_repr(revision: Revision) -> dict[str, Any]:
    return {
        "namespace": revision.namespace,
        "kind": revision.kind,
        "slug": revision.slug,
        "op": revision.op,
        "before_version": revision.before_version,
        "after_version": revision.after_version,
    }


def changeset_repr(changeset: Changeset, ops: Iterable[Revision]) -> dict[str, Any]:
    """``ops`` must already be limited to namespaces the caller can read."""
    return {
        "id": str(changeset.id),
        "seq": changeset.seq,
        "author": changeset.author_name,
        "at": rfc3339(changeset.at),
        "message": changeset.message,
        "comment": changeset.comment,
        "branch": changeset.branch,
        "rpc": changeset.rpc,
        "op_count": changeset.op_count,
        "ops": [op_repr(r) for r in ops],
    }


def revision_repr(revision: Revision, changeset: Changeset | None = None) -> dict[str, Any]:
    changeset = changeset or revision.changeset
    return {
        "changeset_id": str(changeset.id),
        "seq": revision.seq,
        "author": changeset.author_name,
        "at": rfc3339(changeset.at),
        "rpc": changeset.rpc,
        "branch": revision.branch,
        "namespace": revision.namespace,
        "kind": revision.kind,
        "slug": revision.slug,
        "op": revision.op,
        "before_version": revision.before_version,
        "after_version": revision.after_version,
        "before": revision.before,
        "after": revision.after,
    }


# --- schema descriptions -------------------------------------------------------


class ChangesetOpSerializer(serializers.Serializer):
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    op = serializers.ChoiceField(choices=["create", "update", "delete"])
    before_version = serializers.IntegerField(allow_null=True)
    after_version = serializers.IntegerField(allow_null=True)


class ChangesetSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    seq = serializers.IntegerField()
    author = serializers.CharField()
    at = serializers.DateTimeField()
    message = serializers.CharField()
    comment = serializers.CharField(allow_blank=True)
    branch = serializers.CharField(allow_blank=True, help_text='"" is baseline')
    rpc = serializers.CharField()
    op_count = serializers.IntegerField(help_text="All ops, including unreadable ones")
    ops = ChangesetOpSerializer(many=True, help_text="Only ops in namespaces you can read")


class RevisionSerializer(serializers.Serializer):
    changeset_id = serializers.UUIDField()
    seq = serializers.IntegerField()
    author = serializers.CharField()
    at = serializers.DateTimeField()
    rpc = serializers.CharField()
    branch = serializers.CharField(allow_blank=True)
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    op = serializers.ChoiceField(choices=["create", "update", "delete"])
    before_version = serializers.IntegerField(allow_null=True)
    after_version = serializers.IntegerField(allow_null=True)
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)


class ChangesetPageSerializer(serializers.Serializer):
    results = ChangesetSerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)


class RevisionPageSerializer(serializers.Serializer):
    results = RevisionSerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)


class RevisionListSerializer(serializers.Serializer):
    results = RevisionSerializer(many=True)
