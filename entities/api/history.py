"""An entity's past: ``history`` (optionally by key), ``blame`` and ``diff``.

Actions of ``EntityViewSet`` (``entities.api.views`` mixes them in), each
``@action(detail=True)``: parse the query with its serializer
(``atlas.api.keys``), call a selector of ``changesets.selectors``,
render. Reads follow the branch header as every entity read does; blame also
takes ``as_of``/``as_of_time`` exactly as ``retrieve`` does.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import paging, strict
from atlas.api.branch import store_for
from atlas.api.keys import (
    PATCH_HELP,
    AsOfSerializer,
    DiffPointsQuery,
    HistoryQuery,
    as_of_repr,
    points_repr,
)
from atlas.api.openapi import AS_OF_PARAMS, BRANCH_PARAM, PAGE_PARAMS, PROBLEM
from atlas.api.render import rfc3339
from atlas.api.representations import (
    ArchivedBeforeSerializer,
    RevisionPageSerializer,
    revision_repr,
)
from atlas.exceptions import NotFound
from atlas.replicas import has_as_of, replica_read
from changesets.archive import boundary
from changesets.models import Changeset
from changesets.selectors import asof, entity_keys
from changesets.selectors import blame as blames
from changesets.selectors import diff as diffs
from changesets.selectors.log import entity_has_history, entity_history
from entities import access
from entities.api.lookups import path_key, pin_as_of, require_readable
from entities.store import EntityKey

BlameSerializer = inline_serializer(
    "Blame",
    {
        "entity": inline_serializer(
            "BlameEntity",
            {
                "namespace": serializers.CharField(),
                "kind": serializers.CharField(),
                "slug": serializers.CharField(),
                "version": serializers.IntegerField(),
            },
        ),
        "keys": inline_serializer(
            "BlameKey",
            {
                "pointer": serializers.CharField(help_text="RFC 6901, into content"),
                "changeset_id": serializers.UUIDField(),
                "seq": serializers.IntegerField(),
                "author": serializers.CharField(),
                "at": serializers.DateTimeField(),
            },
            many=True,
        ),
        "as_of": AsOfSerializer(required=False),
        "archived": serializers.ListField(
            child=serializers.CharField(),
            required=False,
            help_text="Leaves last set at or before the archive cut (their setter is archived).",
        ),
        "archived_before": ArchivedBeforeSerializer(required=False),
    },
)
EntityDiffSerializer = inline_serializer(
    "EntityDiff",
    {
        "from": AsOfSerializer(),
        "to": AsOfSerializer(allow_null=True, help_text="null: the branch as it reads now"),
        "before": serializers.JSONField(allow_null=True),
        "after": serializers.JSONField(allow_null=True),
        "patch": serializers.ListField(child=serializers.DictField(), help_text=PATCH_HELP),
    },
)


def _blame_repr(entry: blames.Blame) -> dict[str, Any]:
    return {
        "pointer": entry.pointer,
        "changeset_id": str(entry.changeset_id),
        "seq": entry.seq,
        "author": entry.author,
        "at": rfc3339(entry.at),
    }


# ``history``, ``blame`` and ``diff`` of one entity, mixed into ``EntityViewSet``.
# (No class docstring: drf-spectacular would make it every operation's description.)
class HistoryActions:
    @extend_schema(
        operation_id="entities_history",
        summary="An entity's revisions, newest first (works after delete); by key with ?key=",
        parameters=[HistoryQuery, *PAGE_PARAMS, BRANCH_PARAM],
        responses={200: RevisionPageSerializer, 400: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    @action(detail=True, methods=["get"])
    @replica_read()
    def history(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        paging.check_known_params(request, {"key", "page_size", "page_token"})
        pointer = strict.validated(HistoryQuery, request.query_params).get("key")
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        require_readable(request, namespace)

        def fetch(before_seq: int | None, limit: int) -> list[Any]:
            if pointer is None:
                return entity_history(
                    key=key, branch=store.branch, before_seq=before_seq, limit=limit
                )
            return entity_keys.entity_key_history(
                key=key, pointer=pointer, branch=store.branch, before_seq=before_seq, limit=limit
            )

        page = paging.keyset_page(
            request,
            scope=f"history:{store.branch}:{key}",
            field="s",
            field_type=int,
            filters={"k": pointer} if pointer is not None else None,
            fetch=fetch,
            position_of=lambda revision: revision.seq,
        )
        if (
            not page.results
            and not request.query_params.get("page_token")
            and boundary.current() is None
            and not entity_has_history(key=key, branch=store.branch)
        ):
            # After an archive cut an empty history ends at the cut like any other:
            # whatever the key had before it is in the archive (docs/retention.md).
            raise NotFound("No such entity.")
        return Response(
            paging.archived_page(
                {
                    "results": [revision_repr(r) for r in page.results],
                    "next_page_token": page.next_page_token,
                }
            )
        )

    @extend_schema(
        operation_id="entities_blame",
        summary="For every leaf of the content, the changeset that last set it",
        parameters=[*AS_OF_PARAMS, BRANCH_PARAM],
        responses={200: BlameSerializer, 400: PROBLEM, 404: PROBLEM, 410: PROBLEM, 422: PROBLEM},
    )
    @action(detail=True, methods=["get"])
    @replica_read(when=has_as_of)
    def blame(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        paging.check_known_params(request, {"as_of", "as_of_time"})
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        pinned = pin_as_of(request, store)
        require_readable(request, namespace)
        entity = asof.entity_as_of(seq=pinned.seq, key=key) if pinned else store.get(key)
        if entity is None:
            raise NotFound("No such entity." if not pinned else "No such entity at that point.")
        found = blames.blame(
            content=entity.content,
            key=key,
            branch=store.branch,
            upto_seq=pinned.seq if pinned else None,
            branch_owns_key=blames.branch_holds(
                key=key, branch=store.branch, changeset_id=entity.changeset_id
            ),
        )
        body: dict[str, Any] = {
            "entity": {**_key_repr(key), "version": entity.version},
            "keys": [_blame_repr(entry) for entry in found],
        }
        if pinned:
            body["as_of"] = as_of_repr(pinned)
        archived = blames.unresolved(entity.content, found)
        if archived and (marker := boundary.marker()) is not None:
            # Leaves last set at or before the archive cut: their setter is in the archive.
            body["archived"], body["archived_before"] = archived, marker
        return Response(body)

    @extend_schema(
        operation_id="entities_diff",
        summary="The entity between two points, as an RFC 6902 patch",
        parameters=[DiffPointsQuery, BRANCH_PARAM],
        responses={
            200: EntityDiffSerializer,
            400: PROBLEM,
            404: PROBLEM,
            410: PROBLEM,
            422: PROBLEM,
        },
    )
    @action(detail=True, methods=["get"])
    @replica_read()
    def diff(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        paging.check_known_params(request, {"from", "from_time", "to", "to_time"})
        values = strict.validated(DiffPointsQuery, request.query_params)
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        require_readable(request, namespace)
        points = diffs.resolve_points(
            namespaces=access.readable_namespaces(request.user), branch=store.branch, values=values
        )
        found = diffs.entity_diff(
            key=key,
            from_seq=points.start.seq,
            to_seq=_seq(points.end),
            store=store,
        )
        if found.before is None and found.after is None:
            raise NotFound("No such entity at either point.")
        return Response(
            {
                **points_repr(points),
                "before": found.before,
                "after": found.after,
                "patch": found.patch,
            }
        )


def _seq(changeset: Changeset | None) -> int | None:
    return changeset.seq if changeset is not None else None


def _key_repr(key: EntityKey) -> dict[str, str]:
    return {"namespace": key.namespace, "kind": key.kind, "slug": key.slug}
