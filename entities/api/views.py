"""Entity endpoints as viewsets: parse, call one service or selector, render.

``EntityViewSet`` serves ``/entities`` and ``/entities/{ns}/{kind}/{slug}``
(list, retrieve, update = PUT, partial_update = PATCH, destroy) and, from
``entities.api.history``, ``history``, ``blame`` and ``diff``. ``/batch`` and
``/delete-by-query`` are in ``entities.api.bulk``. Routes: ``entities.api.urls``.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import paging, strict
from atlas.api.auth import actor
from atlas.api.branch import store_for
from atlas.api.conditional import (
    etag,
    if_none_match_hits,
    parse_if_match_header,
    parse_if_none_match_put,
)
from atlas.api.idempotency import idempotent
from atlas.api.keys import as_of_repr
from atlas.api.openapi import (
    AS_OF_PARAMS,
    BRANCH_PARAM,
    IDEMPOTENCY_PARAM,
    IF_MATCH_PARAM,
    IF_NONE_MATCH_PARAM,
    IF_NONE_MATCH_PUT_PARAM,
    PAGE_PARAMS,
    PROBLEM,
)
from atlas.api.provenance import request_context
from atlas.api.viewsets import ViewSet
from atlas.exceptions import NotFound
from atlas.replicas import has_as_of, replica_read
from changesets.models import Rpc
from changesets.ops import DeleteOp, PatchOp, PutOp
from changesets.selectors import asof
from changesets.services.apply import changeset_apply
from entities import access
from entities.api import serializers as s
from entities.api.history import HistoryActions
from entities.api.lookups import list_pin, path_key, pin_as_of, require_readable
from entities.api.responses import (
    WRITE_ERRORS,
    WriteResponseSerializer,
    write_response,
)
from entities.api.restore import RestoreActions
from entities.api.trash import trash_page
from entities.store import EntityKey


def _filters_digest(parts: list[Any]) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _list_filters(request: Request) -> tuple[str | None, str | None, str | None, bool]:
    """``namespace``, ``kind``, ``slug_prefix`` (empty = absent) and ``deleted`` of
    ``GET /entities``."""
    paging.check_known_params(
        request,
        {*s.EntityListQuery.names(), "page_size", "page_token", "as_of", "as_of_time"},
    )
    filters = strict.validated(s.EntityListQuery, request.query_params)
    return (
        filters.get("namespace"),
        filters.get("kind"),
        filters.get("slug_prefix"),
        bool(filters.get("deleted")),
    )


class EntityViewSet(HistoryActions, RestoreActions, ViewSet):
    lookup_fields = ("namespace", "kind", "slug")

    @extend_schema(
        operation_id="entities_list",
        summary="List entities in (namespace, kind, slug) order; the trash with deleted=true",
        parameters=[
            s.EntityListQuery,
            *PAGE_PARAMS,
            *AS_OF_PARAMS,
            BRANCH_PARAM,
        ],
        responses={
            200: s.EntityListPageSerializer,
            400: PROBLEM,
            404: PROBLEM,
            410: PROBLEM,
            422: PROBLEM,
        },
    )
    @replica_read(when=has_as_of)
    def list(self, request: Request) -> Response:
        namespace, kind, slug_prefix, deleted = _list_filters(request)
        store = store_for(request)
        if deleted:
            return trash_page(request, store, namespace=namespace, kind=kind, prefix=slug_prefix)
        pinned, point = list_pin(request, store)
        read = functools.partial(asof.entities_as_of, seq=pinned["seq"]) if pinned else store.list
        page = paging.keyset_page(
            request,
            scope="entities",
            field="k",
            field_type=list,
            filters={
                "f": _filters_digest([store.branch, namespace, kind, slug_prefix, *point]),
                "p": pinned,
            },
            fetch=lambda after, limit: read(
                namespaces=access.readable_namespaces(request.user),
                namespace=namespace,
                kind=kind,
                slug_prefix=slug_prefix,
                after=EntityKey(*after) if after is not None else None,
                limit=limit,
            ),
            position_of=lambda e: [e.key.namespace, e.key.kind, e.key.slug],
        )
        body: dict[str, Any] = {
            "results": [s.entity_repr(e) for e in page.results],
            "next_page_token": page.next_page_token,
        }
        if pinned:
            body["as_of"] = pinned
        return Response(body)

    @extend_schema(
        operation_id="entities_get",
        summary="One entity (ETag = version)",
        parameters=[BRANCH_PARAM, IF_NONE_MATCH_PARAM, *AS_OF_PARAMS],
        responses={200: s.EntitySerializer, 304: None, 400: PROBLEM, 404: PROBLEM, 410: PROBLEM},
    )
    @replica_read(when=has_as_of)
    def retrieve(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        paging.check_known_params(request, {"as_of", "as_of_time"})
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        pinned = pin_as_of(request, store)
        require_readable(request, namespace)
        entity = asof.entity_as_of(seq=pinned.seq, key=key) if pinned else store.get(key)
        if entity is None:
            raise NotFound("No such entity." if not pinned else "No such entity at that point.")
        tag = etag(entity.version)
        if if_none_match_hits(request, tag):
            response = Response(status=304)
        else:
            body = s.entity_repr(entity)
            if pinned:
                body["as_of"] = as_of_repr(pinned)
            response = Response(body)
        response["ETag"] = tag
        return response

    @extend_schema(
        operation_id="entities_put",
        summary="Create or replace an entity's content",
        request=s.PutBodySerializer,
        parameters=[BRANCH_PARAM, IF_MATCH_PARAM, IF_NONE_MATCH_PUT_PARAM, IDEMPOTENCY_PARAM],
        responses={
            200: WriteResponseSerializer,
            201: WriteResponseSerializer,
            **{code: PROBLEM for code in WRITE_ERRORS},
        },
    )
    @idempotent
    def update(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        body = strict.validated(s.PutBodySerializer, request.data)
        op = PutOp(
            key,
            body["content"],
            if_match=parse_if_match_header(request),
            if_none_match=parse_if_none_match_put(request),
        )
        result = changeset_apply(
            store=store,
            actor=actor(request),
            ops=[op],
            rpc=Rpc.PUT_ENTITY,
            comment=body.get("comment") or "",
            metadata=body.get("metadata"),
            context=request_context(request),
        )
        return write_response(result, key)

    @extend_schema(
        operation_id="entities_patch",
        summary="RFC 7396 merge patch of an entity's content",
        request=s.PatchBodySerializer,
        parameters=[BRANCH_PARAM, IF_MATCH_PARAM, IDEMPOTENCY_PARAM],
        responses={200: WriteResponseSerializer, **{code: PROBLEM for code in WRITE_ERRORS}},
    )
    @idempotent
    def partial_update(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        body = strict.validated(s.PatchBodySerializer, request.data)
        op = PatchOp(key, body["patch"], if_match=parse_if_match_header(request))
        result = changeset_apply(
            store=store,
            actor=actor(request),
            ops=[op],
            rpc=Rpc.PATCH_ENTITY,
            comment=body.get("comment") or "",
            metadata=body.get("metadata"),
            context=request_context(request),
        )
        return write_response(result, key)

    @extend_schema(
        operation_id="entities_delete",
        summary="Delete an entity (its history stays)",
        request=s.DeleteBodySerializer,
        parameters=[BRANCH_PARAM, IF_MATCH_PARAM, IDEMPOTENCY_PARAM],
        responses={200: WriteResponseSerializer, **{c: PROBLEM for c in (403, 404, 409, 412)}},
    )
    @idempotent
    def destroy(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        body = strict.validated(s.DeleteBodySerializer, request.data)
        op = DeleteOp(key, if_match=parse_if_match_header(request))
        result = changeset_apply(
            store=store,
            actor=actor(request),
            ops=[op],
            rpc=Rpc.DELETE_ENTITY,
            comment=body.get("comment") or "",
            metadata=body.get("metadata"),
            context=request_context(request),
        )
        return write_response(result, key)
