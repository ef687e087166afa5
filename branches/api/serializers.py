"""Branch representations and input parsing (API.md "Branches").

Rendering is plain functions, like the changeset API; the serializers below
describe the same shapes for the OpenAPI schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rest_framework import serializers

from atlas.api.render import rfc3339
from branches.models import MSG_NAME, Branch, BranchStatus
from branches.selectors import Diff, OverlayChange, is_valid_name, member_names
from changesets.api.serializers import ChangesetSerializer
from changesets.models import Changeset
from entities.api.serializers import (
    Errors,
    check_bool,
    check_comment,
    check_fields,
    comment_field,
    is_empty_body,
    require_object,
)
from entities.store import EntityKey


def visible_changeset_ids(
    branches: Iterable[Branch], readable: Sequence[str] | None
) -> set[str] | None:
    """The fork and merge changesets of ``branches`` the caller can see (``None`` = all).

    The fork is whatever baseline changeset was newest when the branch was cut,
    often in a namespace the caller cannot read: its id must not show (not
    visible = not there). One query for a whole page of branches.
    """
    if readable is None:
        return None
    ids = {i for b in branches for i in (b.fork_changeset_id, b.merged_changeset_id) if i}
    if not ids or not readable:
        return set()
    rows = Changeset.objects.filter(pk__in=ids, namespaces__overlap=list(readable))
    return {str(i) for i in rows.values_list("id", flat=True)}


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


def parse_create(data: Any) -> tuple[str, str]:
    body = require_object(data)
    errors = Errors()
    check_fields(body, errors, "", required={"name"}, optional={"comment"})
    comment = check_comment(body, errors)
    if "name" in body and not is_valid_name(body["name"]):
        errors.add("/name", MSG_NAME)
    errors.raise_if_any()
    return body["name"], comment


def parse_member_put(data: Any) -> None:
    """No body, or an empty object: membership has no attributes."""
    if is_empty_body(data):
        return
    body = require_object(data)
    errors = Errors()
    check_fields(body, errors, "", required=set(), optional=set())
    errors.raise_if_any()


def parse_merge(data: Any) -> tuple[bool, str]:
    """``{"dry_run"?, "comment"?}``; an empty body is fine."""
    if is_empty_body(data):
        return False, ""
    body = require_object(data)
    errors = Errors()
    check_fields(body, errors, "", required=set(), optional={"dry_run", "comment"})
    comment = check_comment(body, errors)
    dry_run = check_bool(body, "dry_run", errors)
    errors.raise_if_any()
    return dry_run, comment


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


class BranchPageSerializer(serializers.Serializer):
    results = BranchSerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)


class BranchCreateSerializer(serializers.Serializer):
    name = serializers.RegexField(r"^[a-z0-9][a-z0-9._-]{0,62}$")
    comment = comment_field()


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
    behind = serializers.IntegerField(help_text="Baseline changesets since the fork")
    ahead = serializers.IntegerField(help_text="The branch's changesets")
    changes = BranchChangeSerializer(many=True, help_text="One page, in key order")
    next_page_token = serializers.CharField(allow_null=True)


class MergeBodySerializer(serializers.Serializer):
    dry_run = serializers.BooleanField(required=False, default=False)
    comment = comment_field()


class MergeResponseSerializer(serializers.Serializer):
    changeset = ChangesetSerializer(allow_null=True)
    merged = EntityRefSerializer(many=True, help_text="Entities that landed (or would)")
    dry_run = serializers.BooleanField()
    branch = BranchSerializer()
