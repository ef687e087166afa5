"""Changeset endpoints: one viewset over the log (``GET /log/...`` is in ``log``).

Thin: an input serializer (:mod:`changesets.api.serializers`), one selector
or service, a representation. Paging is :func:`atlas.api.paging.keyset_page`.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
)
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import paging, strict
from atlas.api import representations as r
from atlas.api.auth import actor
from atlas.api.branch import store_for
from atlas.api.idempotency import idempotent
from atlas.api.inputs import ref_key
from atlas.api.openapi import BRANCH_PARAM, IDEMPOTENCY_PARAM, PAGE_PARAMS, PROBLEM
from atlas.api.parsers import read_limited
from atlas.api.provenance import request_context
from atlas.exceptions import NotFound, UnsupportedMediaType
from atlas.replicas import replica_read
from changesets import ndjson
from changesets.api import serializers as s
from changesets.api.filters import ChangesetFilter, filter_digest
from changesets.models import Changeset
from changesets.selectors.changeset_ops import (
    changeset_ops,
    changeset_revisions,
    first_ops,
    visible_op_counts,
)
from changesets.selectors.log import changeset_get, changeset_list, sees_every_namespace
from changesets.services.interchange import changeset_import
from changesets.services.revert import changeset_revert, revert_target
from entities import access

# API.md "Decisions for the added sections": a list page embeds at most this
# many ops per changeset; one changeset pages its ops, this many by default.
LIST_OPS = 100
DEFAULT_OPS_PAGE_SIZE = 100
_WRITE_PROBLEMS = {code: PROBLEM for code in (400, 403, 404, 409, 410, 413, 415, 422)}


class NdjsonParser(BaseParser):
    """Hands the raw body (size-limited) to the view; parsing is the service's, strict."""

    media_type = ndjson.MEDIA_TYPE

    # DRF stores whatever ``parse`` returns as ``request.data``; the stubs allow only
    # a mapping, so the override's bytes need the ignore.
    def parse(  # type: ignore[override]
        self, stream: Any, media_type: Any = None, parser_context: Any = None
    ) -> bytes:
        return read_limited(stream, parser_context)


class _ChangesetSchema(AutoSchema):
    """The import file is the request: an absent body is refused (415 without a
    Content-Type, 400 for an empty file), so the document marks that body required."""

    def _get_request_body(self, direction: str = "request") -> dict[str, Any] | None:
        body = super()._get_request_body(direction)
        if body and getattr(self.view, "action", None) == "import_file":
            body["required"] = True
        return body


# The log: list and read changesets; revert one, or move it between servers as NDJSON.
# (No class docstring: drf-spectacular would make it every operation's description.)
class ChangesetViewSet(viewsets.ViewSet):
    lookup_url_kwarg = "changeset_id"
    lookup_value_converter = "str"
    schema = _ChangesetSchema()

    def get_object(self) -> Changeset:
        """The changeset, or 404 when it does not exist or has no op the caller can read."""
        changeset_id = self.kwargs[self.lookup_url_kwarg]
        try:
            uuid.UUID(changeset_id)
        except ValueError as exc:
            raise NotFound("No such changeset.") from exc
        namespaces = access.readable_namespaces(self.request.user)
        changeset = changeset_get(changeset_id=changeset_id, namespaces=namespaces)
        if changeset is None:
            raise NotFound("No such changeset.")
        return changeset

    @extend_schema(
        operation_id="changesets_list",
        summary="Changesets, newest first",
        parameters=[ChangesetFilter, *PAGE_PARAMS],
        responses={200: r.ChangesetPageSerializer, 400: PROBLEM, 410: PROBLEM, 422: PROBLEM},
    )
    @replica_read()
    def list(self, request: Request) -> Response:
        paging.check_known_params(request, {*ChangesetFilter.NAMES, "page_size", "page_token"})
        filters = strict.validated(ChangesetFilter, request.query_params)
        namespaces = access.readable_namespaces(request.user)
        page = paging.keyset_page(
            request,
            scope="changesets",
            field="s",
            field_type=int,
            filters={"f": filter_digest(request)},
            fetch=lambda before_seq, limit: changeset_list(
                namespaces=namespaces, before_seq=before_seq, limit=limit, **filters
            ),
            position_of=lambda row: row.seq,
        )
        counts = visible_op_counts(changesets=page.results, namespaces=namespaces)
        ops = first_ops(changesets=page.results, namespaces=namespaces, limit=LIST_OPS)
        results = [
            r.changeset_repr(
                c,
                ops[c.id],
                namespaces=namespaces,
                op_count_visible=counts[c.id],
                ops_truncated=counts[c.id] > len(ops[c.id]),
            )
            for c in page.results
        ]
        return Response(
            paging.archived_page({"results": results, "next_page_token": page.next_page_token})
        )

    @extend_schema(
        operation_id="changesets_get",
        summary="One changeset, with one page of the ops you can read",
        parameters=[
            OpenApiParameter(
                "page_size",
                OpenApiTypes.INT,
                description=f"Ops per page (default {DEFAULT_OPS_PAGE_SIZE},"
                f" max {paging.MAX_PAGE_SIZE}).",
            ),
            OpenApiParameter(
                "page_token", OpenApiTypes.STR, description="ops_next_page_token of a page"
            ),
        ],
        responses={
            200: r.ChangesetDetailSerializer,
            400: PROBLEM,
            404: PROBLEM,
            410: PROBLEM,
            422: PROBLEM,
        },
    )
    def retrieve(self, request: Request, changeset_id: str) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        size = paging.int_param(
            request, "page_size", default=DEFAULT_OPS_PAGE_SIZE, maximum=paging.MAX_PAGE_SIZE
        )
        changeset = self.get_object()
        namespaces = access.readable_namespaces(request.user)
        page = paging.keyset_page(
            request,
            scope="changeset-ops",
            field="i",
            field_type=int,
            filters={"c": str(changeset.id)},
            fetch=lambda after, limit: changeset_ops(
                changeset=changeset, namespaces=namespaces, after_id=after, limit=limit
            ),
            position_of=lambda revision: revision.id,
            size=size,
        )
        count = visible_op_counts(changesets=[changeset], namespaces=namespaces)[changeset.id]
        return Response(
            r.changeset_repr(
                changeset,
                page.results,
                namespaces=namespaces,
                op_count_visible=count,
                ops_next_page_token=page.next_page_token,
            )
        )

    @extend_schema(
        operation_id="changesets_revisions",
        summary="A changeset's revision rows (before and after images), in op order, paged",
        parameters=PAGE_PARAMS,
        responses={
            200: r.RevisionPageSerializer,
            400: PROBLEM,
            404: PROBLEM,
            410: PROBLEM,
            422: PROBLEM,
        },
    )
    @action(detail=True, methods=["get"])
    def revisions(self, request: Request, changeset_id: str) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        size = paging.page_size(request)
        changeset = self.get_object()
        namespaces = access.readable_namespaces(request.user)
        page = paging.keyset_page(
            request,
            scope="changeset-revisions",
            field="i",
            field_type=int,
            filters={"c": str(changeset.id)},
            fetch=lambda after, limit: changeset_revisions(
                changeset=changeset, namespaces=namespaces, after_id=after, limit=limit
            ),
            position_of=lambda revision: revision.id,
            size=size,
        )
        results = [r.revision_repr(revision, changeset) for revision in page.results]
        return Response({"results": results, "next_page_token": page.next_page_token})

    @extend_schema(
        operation_id="changesets_revert",
        summary="Undo a changeset as a new changeset",
        request=s.RevertBodySerializer,
        parameters=[BRANCH_PARAM, IDEMPOTENCY_PARAM],
        responses={200: s.ChangesetActionResponseSerializer, **_WRITE_PROBLEMS},
    )
    @action(detail=True, methods=["post"])
    @idempotent
    def revert(self, request: Request, changeset_id: str) -> Response:
        # Before the body is read: a hidden op must not make a 422 where a missing
        # changeset is 404. The row found here is the one the service reverts.
        changeset = revert_target(actor=actor(request), changeset_id=changeset_id)
        store = store_for(request)
        body = strict.validated(s.RevertBodySerializer, request.data)
        result = changeset_revert(
            store=store,
            actor=actor(request),
            changeset=changeset,
            dry_run=body["dry_run"],
            comment=body.get("comment", ""),
            metadata=body.get("metadata"),
            context=request_context(request),
            granularity=body["granularity"],
            only=[ref_key(ref) for ref in body["only"]] if "only" in body else None,
        )
        return self._planned(request, result, body["dry_run"])

    @extend_schema(
        operation_id="changesets_export",
        summary="The changeset as NDJSON (envelope line, then one line per op)",
        responses={
            (200, ndjson.MEDIA_TYPE): OpenApiResponse(OpenApiTypes.STR),
            404: PROBLEM,
            410: PROBLEM,
        },
    )
    @action(detail=True, methods=["get"])
    def export(self, request: Request, changeset_id: str) -> StreamingHttpResponse:
        changeset = self.get_object()
        namespaces = access.readable_namespaces(request.user)
        revisions = changeset_revisions(changeset=changeset, namespaces=namespaces)
        response = StreamingHttpResponse(
            ndjson.export_lines(
                changeset, revisions, sees_all=sees_every_namespace(changeset, namespaces)
            ),
            content_type=ndjson.MEDIA_TYPE,
        )
        response["Content-Disposition"] = f'attachment; filename="changeset-{changeset.id}.ndjson"'
        return response

    @extend_schema(
        operation_id="changesets_import",
        summary="Apply an exported changeset file as one new changeset",
        request={ndjson.MEDIA_TYPE: OpenApiTypes.STR},
        parameters=[s.ImportQuerySerializer, BRANCH_PARAM, IDEMPOTENCY_PARAM],
        responses={200: s.ChangesetActionResponseSerializer, **_WRITE_PROBLEMS},
    )
    @action(
        detail=False,
        methods=["post"],
        url_path="import",
        url_name="import",
        parser_classes=[NdjsonParser],
    )
    @idempotent
    def import_file(self, request: Request) -> Response:
        dry_run = strict.validated(s.ImportQuerySerializer, request.query_params).get(
            "dry_run", False
        )
        if request.content_type.split(";")[0].strip() != ndjson.MEDIA_TYPE:
            raise UnsupportedMediaType(f"Send the file as {ndjson.MEDIA_TYPE}.")
        store = store_for(request)
        # An empty body never reaches the parser: DRF hands the view an empty dict.
        body = request.data if isinstance(request.data, bytes | str) else b""
        document = ndjson.parse(body)
        result = changeset_import(
            store=store,
            actor=actor(request),
            document=document,
            dry_run=dry_run,
            context=request_context(request),
        )
        return self._planned(request, result, dry_run)

    def _planned(self, request: Request, result: Any, dry_run: bool) -> Response:
        """The answer of a planned write; its changeset as the caller sees it
        (the caller wrote every op, so in practice all of it)."""
        namespaces = access.readable_namespaces(request.user)
        changeset = result.changeset
        rendered = (
            r.changeset_repr(changeset, result.applied.revisions, namespaces=namespaces)
            if changeset
            else None
        )
        return Response({"changeset": rendered, "ops": result.ops, "dry_run": dry_run})
