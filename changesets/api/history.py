"""Key-level reads across a namespace: ``GET /revisions`` and ``GET /diff``.

Thin, as every view here: a query serializer, one selector
(``changesets.selectors.keys``, ``changesets.selectors.diff``), keyset paging
(:func:`atlas.api.paging.keyset_page`). Both follow the branch header, and
show only what the caller may read: a namespace they cannot read lists
nothing, as the changeset list's filter does (invariant 8).
"""

from __future__ import annotations

import hashlib
from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import paging, strict
from atlas.api.branch import store_for
from atlas.api.inputs import kind_field, namespace_field
from atlas.api.keys import (
    PATCH_HELP,
    AsOfSerializer,
    NamespaceDiffQuery,
    PointerField,
    RequiredQuery,
    points_repr,
)
from atlas.api.openapi import BRANCH_PARAM, PAGE_PARAMS, PROBLEM
from atlas.api.representations import RevisionPageSerializer, revision_repr
from atlas.api.viewsets import ViewSet
from atlas.exceptions import BadRequest
from atlas.replicas import replica_read
from changesets.api.filters import NoNulField, TimestampField
from changesets.selectors import diff as diffs
from changesets.selectors import keys
from entities import access
from entities.store import EntityKey, EntityStore


# ``GET /revisions``: one namespace (required), the rest narrow it. Fields are in
# the order their errors are reported.
class RevisionsQuery(RequiredQuery):
    NAMES = ("namespace", "kind", "key", "author", "since", "until")

    namespace = namespace_field(required=True)
    kind = kind_field(required=False)
    key = PointerField(
        required=False,
        help_text="Only revisions where a changed pointer equals, lies inside or contains it.",
    )
    author = NoNulField(required=False)
    since = TimestampField(required=False, help_text="at >= since")
    until = TimestampField(required=False, help_text="at <= until (its whole millisecond)")


@extend_schema_serializer(many=False)
class RevisionListSerializer(RevisionPageSerializer):
    pass


class DiffItemSerializer(serializers.Serializer):
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    op = serializers.ChoiceField(choices=["create", "update", "delete"])
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)
    patch = serializers.ListField(child=serializers.DictField(), help_text=PATCH_HELP)


@extend_schema_serializer(many=False)
class DiffPageSerializer(serializers.Serializer):
    results = DiffItemSerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)
    # "from" is a keyword: the fields are named in get_fields.

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = AsOfSerializer()
        fields["to"] = AsOfSerializer(allow_null=True, help_text="null: the branch as it reads now")
        return fields


def _digest(request: Request, names: tuple[str, ...], branch: str) -> str:
    """Binds a page token to the query it was issued for (the raw values, as sent)."""
    raw = repr([branch, *(request.query_params.get(name) for name in names)])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _after(position: str | None) -> tuple[int, int] | None:
    if position is None:
        return None
    try:
        seq, rid = position.split(".")
        return int(seq), int(rid)
    except ValueError as exc:
        raise BadRequest(paging.MSG_BAD_TOKEN, pointer="/page_token") from exc


# Revisions across one namespace, newest first: "who changed this field, and when".
class RevisionViewSet(ViewSet):
    @extend_schema(
        operation_id="revisions_list",
        summary="Revisions across a namespace, newest first; by key with ?key=",
        parameters=[RevisionsQuery, *PAGE_PARAMS, BRANCH_PARAM],
        responses={
            200: RevisionListSerializer,
            400: PROBLEM,
            404: PROBLEM,
            410: PROBLEM,
            422: PROBLEM,
        },
    )
    @replica_read()
    def list(self, request: Request) -> Response:
        paging.check_known_params(request, {*RevisionsQuery.NAMES, "page_size", "page_token"})
        where = keys.RevisionFilter(**strict.validated(RevisionsQuery, request.query_params))
        store = store_for(request)
        readable = access.can_read(request.user, where.namespace)
        page = paging.keyset_page(
            request,
            scope="revisions",
            field="p",
            field_type=str,
            filters={"f": _digest(request, RevisionsQuery.NAMES, store.branch)},
            fetch=lambda after, limit: (
                keys.namespace_revisions(
                    where=where, branch=store.branch, after=_after(after), limit=limit
                )
                if readable
                else []
            ),
            position_of=lambda revision: f"{revision.seq}.{revision.id}",
        )
        return Response(
            paging.archived_page(
                {
                    "results": [revision_repr(r) for r in page.results],
                    "next_page_token": page.next_page_token,
                }
            )
        )


DIFF_NAMES = ("namespace", "kind", "slug_prefix", "from", "from_time", "to", "to_time")


# Every entity of a namespace whose content differs between two points, in key order.
class DiffViewSet(ViewSet):
    @extend_schema(
        operation_id="diff_list",
        summary="Entities whose content differs between two points, in key order",
        parameters=[NamespaceDiffQuery, *PAGE_PARAMS, BRANCH_PARAM],
        responses={200: DiffPageSerializer, 400: PROBLEM, 404: PROBLEM, 410: PROBLEM, 422: PROBLEM},
    )
    @replica_read()
    def list(self, request: Request) -> Response:
        paging.check_known_params(request, {*DIFF_NAMES, "page_size", "page_token"})
        values = strict.validated(NamespaceDiffQuery, request.query_params)
        store = store_for(request)
        namespaces = access.readable_namespaces(request.user)
        scope = f"diff:{store.branch}"
        # "to" absent is now, pinned on the first page: later pages carry it in the token.
        position = paging.page_position(scope, request)
        pinned = position.get("t") if position else None
        if isinstance(pinned, str) and not ({"to", "to_time"} & set(values)):
            values = {**values, "to": pinned}
        points = diffs.resolve_points(namespaces=namespaces, branch=store.branch, values=values)
        listing = diffs.Listing(
            namespaces=namespaces,
            namespace=values["namespace"],
            kind=values.get("kind"),
            slug_prefix=values.get("slug_prefix"),
        )
        page = paging.keyset_page(
            request,
            scope=scope,
            field="k",
            field_type=list,
            filters={
                "f": _digest(request, DIFF_NAMES, store.branch),
                "t": str(points.end.id) if points.end is not None else None,
            },
            fetch=lambda after, limit: _diff_page(
                listing, points, store, EntityKey(*after) if after else None, limit
            ),
            position_of=lambda d: [d.key.namespace, d.key.kind, d.key.slug],
        )
        return Response(
            {
                "results": [_diff_repr(d) for d in page.results],
                "next_page_token": page.next_page_token,
                **points_repr(points),
            }
        )


def _diff_page(
    listing: diffs.Listing,
    points: diffs.Points,
    store: EntityStore,
    after: EntityKey | None,
    limit: int,
) -> list[diffs.EntityDiff]:
    if points.end is None:
        return diffs.namespace_diff_to_store(
            listing=listing, from_seq=points.start.seq, store=store, after=after, limit=limit
        )
    return diffs.namespace_diff(
        listing=listing,
        from_seq=points.start.seq,
        to_seq=points.end.seq,
        after=after,
        limit=limit,
    )


def _diff_repr(found: diffs.EntityDiff) -> dict[str, Any]:
    return {
        "namespace": found.key.namespace,
        "kind": found.key.kind,
        "slug": found.key.slug,
        "op": found.op,
        "before": found.before,
        "after": found.after,
        "patch": found.patch,
    }
