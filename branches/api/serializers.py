"""Branch representations and inputs (API.md "Branches").

Rendering is plain functions, like the changeset API; the output serializers
below describe the same shapes for the OpenAPI schema. Bodies are
:mod:`atlas.api.strict` serializers: one description validates and documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from atlas.api import strict
from atlas.api.inputs import (
    ObjectListField,
    comment_field,
    granularity_field,
    kind_field,
    metadata_field,
    namespace_field,
    ref_key,
    slug_field,
)
from atlas.api.render import rfc3339
from atlas.api.representations import ChangesetSerializer, InverseOpSerializer
from atlas.exceptions import ValidationFailed
from branches.keymerge import SIDES, Resolution
from branches.models import MSG_NAME, NAME_PATTERN, Branch, BranchStatus
from branches.selectors import (
    Diff,
    OverlayChange,
    is_valid_name,
    member_names,
    visible_changeset_ids,
)
from changesets import pointers
from entities.store import EntityKey


def branch_repr(
    branch: Branch,
    readable: Sequence[str] | None,
    visible: set[str] | None = None,
    members: dict[int, list[str]] | None = None,
) -> dict[str, Any]:
    """``readable``: the caller's readable namespaces (``None`` = all); ``visible``: from
    :func:`visible_changeset_ids`, ``members``: from
    :func:`branches.selectors.member_names`, for a page of branches (each computed
    here when absent)."""
    if members is None:
        members = member_names([branch])
    namespaces = branch.namespaces
    if readable is not None:
        namespaces = [n for n in namespaces if n in set(readable)]
        if visible is None:
            visible = visible_changeset_ids([branch], readable)

    def shown(changeset_id: Any) -> str | None:
        if not changeset_id or (visible is not None and str(changeset_id) not in visible):
            return None
        return str(changeset_id)

    return {
        "name": branch.name,
        "status": branch.status,
        "created_by": branch.created_by_name,
        "created_at": rfc3339(branch.created_at),
        "fork_changeset_id": shown(branch.fork_changeset_id),
        "fork_seq": branch.fork_seq,
        "base_changeset_id": shown(branch.base_changeset_id),
        "base_seq": branch.base_seq,
        "synced_at": rfc3339(branch.synced_at),
        "merged_changeset_id": shown(branch.merged_changeset_id),
        "comment": branch.comment,
        "closed_at": rfc3339(branch.closed_at),
        "namespaces": sorted(namespaces),
        "members": members.get(branch.pk, []),
    }


def ref_repr(key: EntityKey) -> dict[str, str]:
    return {"namespace": key.namespace, "kind": key.kind, "slug": key.slug}


def change_repr(change: OverlayChange) -> dict[str, Any]:
    return {
        **ref_repr(change.key),
        "op": change.op,
        "base_version": change.base_version,
        "baseline_version": change.baseline_version,
        "conflict": change.conflict,
    }


def diff_repr(diff: Diff, next_page_token: str | None) -> dict[str, Any]:
    return {
        "behind": diff.behind,
        "ahead": diff.ahead,
        "changes": [change_repr(c) for c in diff.changes],
        "next_page_token": next_page_token,
    }


STATUSES = [s.value for s in BranchStatus]


# --- schema descriptions -------------------------------------------------------


class BranchSerializer(serializers.Serializer):
    name = serializers.CharField()
    status = serializers.ChoiceField(choices=STATUSES)
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    fork_changeset_id = serializers.UUIDField(
        allow_null=True,
        help_text="Newest baseline changeset when the branch was cut (null on an empty log,"
        " or when you cannot see that changeset)",
    )
    fork_seq = serializers.IntegerField(help_text="Its seq (0 on an empty log)")
    base_changeset_id = serializers.UUIDField(
        allow_null=True,
        help_text="The base point: the fork, or the baseline head at the last sync (null as"
        " for the fork)",
    )
    base_seq = serializers.IntegerField(help_text="Its seq; behind counts from here")
    synced_at = serializers.DateTimeField(allow_null=True, help_text="The last sync (null: none)")
    merged_changeset_id = serializers.UUIDField(allow_null=True)
    comment = serializers.CharField(allow_blank=True)
    closed_at = serializers.DateTimeField(allow_null=True, help_text="When merged or abandoned")
    namespaces = serializers.ListField(
        child=serializers.CharField(), help_text="Namespaces it wrote that you can read"
    )
    members = serializers.ListField(
        child=serializers.CharField(),
        help_text="Usernames of its members (besides its creator, they may write it), sorted",
    )


# A page is one object, also where a viewset's ``list`` answers it.
@extend_schema_serializer(many=False)
class BranchPageSerializer(serializers.Serializer):
    results = BranchSerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)


# --- inputs ------------------------------------------------------------------------


# Fields in the order their errors are reported.
class BranchCreateSerializer(strict.Body):
    comment = comment_field()
    name = strict.StrictRegexField(NAME_PATTERN, message=MSG_NAME, check=is_valid_name)


class EntityRefSerializer(serializers.Serializer):
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()


class BranchChangeSerializer(EntityRefSerializer):
    op = serializers.ChoiceField(choices=["create", "update", "delete"])
    base_version = serializers.IntegerField(
        allow_null=True, help_text="Baseline version when the branch first wrote it"
    )
    baseline_version = serializers.IntegerField(
        allow_null=True, help_text="Baseline version now (null: absent)"
    )
    conflict = serializers.BooleanField()


class DiffSerializer(serializers.Serializer):
    behind = serializers.IntegerField(
        help_text="Baseline changesets since the base point (the fork, or the last sync)"
    )
    ahead = serializers.IntegerField(help_text="The branch's changesets")
    changes = BranchChangeSerializer(many=True, help_text="One page, in key order")
    next_page_token = serializers.CharField(allow_null=True)


# ``GET /branches?status=``; paging is ``keyset_page``'s.
class BranchListQuery(strict.Query):
    status = strict.QueryChoiceField(STATUSES, required=False)

    def refuse(self, errors: list[dict[str, str]]) -> None:
        # As this listing always answered: the parameter named in the detail.
        raise ValidationFailed(f"status must be one of {', '.join(STATUSES)}.", errors=errors)


# One settled conflict: ``{"namespace", "kind", "slug", "pointer"?, "take"}``.
class ResolutionBody(strict.Body):
    first = ()
    namespace = namespace_field()
    kind = kind_field()
    slug = slug_field()
    pointer = strict.StrictRegexField(
        pointers.POINTER_PATTERN,
        message=pointers.MSG_POINTER,
        check=pointers.is_pointer,
        required=False,
        help_text="The conflict's pointer; settles every conflict at or inside it."
        " Absent: the whole entity from that side",
    )
    take = strict.StrictChoiceField(list(SIDES), help_text="Which side's value wins")


def resolutions(body: dict[str, Any]) -> list[Resolution]:
    return [
        Resolution(ref_key(r), r["take"], r.get("pointer")) for r in body.get("resolutions", [])
    ]


def resolutions_field() -> serializers.Field:
    return ObjectListField(
        child=ResolutionBody(),
        required=False,
        help_text="Settle conflicts (key granularity): per pointer or per entity",
    )


# ``{"dry_run"?, "comment"?, "metadata"?, "granularity"?, "resolutions"?}``; no body = ``{}``.
class MergeBodySerializer(strict.Body):
    comment = comment_field()
    dry_run = strict.StrictBooleanField(required=False, default=False)
    metadata = metadata_field()
    granularity = granularity_field(
        "entity",
        "entity: refuse any entity baseline changed since the branch wrote it; key: merge"
        " pointer by pointer, conflicts only where both sides changed one pointer differently",
    )
    resolutions = resolutions_field()


class SyncBodySerializer(strict.Body):
    comment = comment_field()
    dry_run = strict.StrictBooleanField(required=False, default=False)
    metadata = metadata_field()
    granularity = granularity_field(
        "key",
        "key: merge baseline's newer changes pointer by pointer; entity: any entity both"
        " changed is a conflict",
    )
    resolutions = resolutions_field()


class MergeResponseSerializer(serializers.Serializer):
    changeset = ChangesetSerializer(allow_null=True)
    merged = EntityRefSerializer(many=True, help_text="Entities that landed (or would)")
    dry_run = serializers.BooleanField()
    branch = BranchSerializer()


class SyncResponseSerializer(serializers.Serializer):
    changeset = ChangesetSerializer(
        allow_null=True, help_text="The SyncBranch changeset (null: no content moved, or dry run)"
    )
    ops = InverseOpSerializer(many=True, help_text="What the sync writes on the branch")
    dry_run = serializers.BooleanField()
    branch = BranchSerializer()
