"""Changeset log endpoints: list, get, revisions."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from atlas.api import paging
from atlas.api.render import parse_rfc3339, rfc3339
from atlas.exceptions import BadRequest, NotFound, ValidationFailed
from changesets.api.serializers import (
    ChangesetDetailSerializer,
    ChangesetPageSerializer,
    RevisionPageSerializer,
    changeset_repr,
    revision_repr,
)
from changesets.chain import GENESIS
from changesets.models import Changeset, LogHead, Rpc
from changesets.selectors.log import (
    changeset_get,
    changeset_list,
    changeset_ops,
    changeset_revisions,
    first_ops,
    visible_op_counts,
)
from entities import access
from entities import validation as v
from entities.api.views import NAMESPACE_SCHEMA

PROBLEM = OpenApiTypes.OBJECT
_FILTERS = ("branch", "namespace", "author", "rpc", "since", "until")
# API.md "Decisions for the added sections": a list page embeds at most this
# many ops per changeset; one changeset pages its ops, this many by default.
LIST_OPS = 100
DEFAULT_OPS_PAGE_SIZE = 100
_PAGE_PARAMS = [
    OpenApiParameter("page_size", OpenApiTypes.INT),
    OpenApiParameter("page_token", OpenApiTypes.STR),
]


def _timestamp(request: Request, name: str, errors: list[dict[str, str]]) -> datetime | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    value = parse_rfc3339(raw)
    if value is None:
        errors.append(
            {"pointer": f"/{name}", "detail": "Must be an RFC 3339 timestamp with offset."}
        )
        return None
    return value


def get_visible_changeset(request: Request, changeset_id: str) -> Changeset:
    """The changeset, or 404 when it does not exist or has no op the caller can read."""
    try:
        uuid.UUID(changeset_id)
    except ValueError as exc:
        raise NotFound("No such changeset.") from exc
    changeset = changeset_get(
        changeset_id=changeset_id, namespaces=access.readable_namespaces(request.user)
    )
    if changeset is None:
        raise NotFound("No such changeset.")
    return changeset


def _after_revision(request: Request, scope: str, changeset: Changeset) -> int | None:
    """The revision id a ``page_token`` of this changeset's ``scope`` listing resumes after."""
    position = paging.page_position(scope, request)
    if position is None:
        return None
    after = position.get("i")
    if position.get("c") != str(changeset.id) or type(after) is not int:
        raise BadRequest("The page token belongs to another listing.", pointer="/page_token")
    return after


def _next_token(request: Request, scope: str, changeset: Changeset, last_id: int) -> str:
    return paging.encode_token(scope, request, {"c": str(changeset.id), "i": last_id})


class ChangesetListView(APIView):
    @extend_schema(
        operation_id="changesets_list",
        summary="Changesets, newest first",
        parameters=[
            OpenApiParameter(
                "branch",
                {"type": "string", "pattern": r"^[^\x00]*$"},
                description="Absent = all visible; present = that branch; empty = baseline.",
            ),
            OpenApiParameter("namespace", NAMESPACE_SCHEMA),
            OpenApiParameter("author", {"type": "string", "pattern": r"^[^\x00]*$"}),
            OpenApiParameter("rpc", OpenApiTypes.STR, enum=[r.value for r in Rpc]),
            OpenApiParameter("since", OpenApiTypes.DATETIME, description="at >= since"),
            OpenApiParameter(
                "until", OpenApiTypes.DATETIME, description="at <= until (its whole millisecond)"
            ),
            *_PAGE_PARAMS,
        ],
        responses={200: ChangesetPageSerializer, 400: PROBLEM, 422: PROBLEM},
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        paging.check_known_params(request, {*_FILTERS, "page_size", "page_token"})
        errors: list[dict[str, str]] = []
        branch = params.get("branch")  # None = all; "" = baseline
        namespace = params.get("namespace") or None
        if namespace is not None and not v.is_valid_namespace(namespace):
            errors.append({"pointer": "/namespace", "detail": v.MSG_NAMESPACE})
        rpc = params.get("rpc") or None
        if rpc is not None and rpc not in Rpc.values:
            errors.append({"pointer": "/rpc", "detail": f"One of {', '.join(Rpc.values)}."})
        for name in ("author", "branch"):
            if "\x00" in (params.get(name) or ""):
                errors.append({"pointer": f"/{name}", "detail": "May not contain U+0000."})
        since = _timestamp(request, "since", errors)
        until = _timestamp(request, "until", errors)
        if errors:
            raise ValidationFailed(errors[0]["detail"], pointer=errors[0]["pointer"], errors=errors)
        limit = paging.page_size(request)
        digest = hashlib.sha256(repr([params.get(f) for f in _FILTERS]).encode()).hexdigest()[:16]
        position = paging.page_position("changesets", request)
        before_seq = None
        if position is not None:
            before_seq = position.get("s")
            if position.get("f") != digest or not isinstance(before_seq, int):
                raise BadRequest(
                    "The page token belongs to another listing.", pointer="/page_token"
                )
        namespaces = access.readable_namespaces(request.user)
        rows = changeset_list(
            namespaces=namespaces,
            branch=branch,
            namespace=namespace,
            author=params.get("author") or None,
            rpc=rpc,
            since=since,
            until=until,
            before_seq=before_seq,
            limit=limit + 1,
        )
        next_token = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_token = paging.encode_token(
                "changesets", request, {"s": rows[-1].seq, "f": digest}
            )
        counts = visible_op_counts(changesets=rows, namespaces=namespaces)
        ops = first_ops(changesets=rows, namespaces=namespaces, limit=LIST_OPS)
        return Response(
            {
                "results": [
                    changeset_repr(
                        c,
                        ops[c.id],
                        namespaces=namespaces,
                        op_count_visible=counts[c.id],
                        ops_truncated=counts[c.id] > len(ops[c.id]),
                    )
                    for c in rows
                ],
                "next_page_token": next_token,
            }
        )


class ChangesetDetailView(APIView):
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
        responses={200: ChangesetDetailSerializer, 400: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    def get(self, request: Request, changeset_id: str) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        limit = paging.int_param(
            request, "page_size", default=DEFAULT_OPS_PAGE_SIZE, maximum=paging.MAX_PAGE_SIZE
        )
        changeset = get_visible_changeset(request, changeset_id)
        after = _after_revision(request, "changeset-ops", changeset)
        namespaces = access.readable_namespaces(request.user)
        ops = changeset_ops(
            changeset=changeset, namespaces=namespaces, after_id=after, limit=limit + 1
        )
        next_token = None
        if len(ops) > limit:
            ops = ops[:limit]
            next_token = _next_token(request, "changeset-ops", changeset, ops[-1].id)
        count = visible_op_counts(changesets=[changeset], namespaces=namespaces)[changeset.id]
        return Response(
            changeset_repr(
                changeset,
                ops,
                namespaces=namespaces,
                op_count_visible=count,
                ops_next_page_token=next_token,
            )
        )


class ChangesetRevisionsView(APIView):
    @extend_schema(
        operation_id="changesets_revisions",
        summary="A changeset's revision rows (before and after images), in op order, paged",
        parameters=_PAGE_PARAMS,
        responses={200: RevisionPageSerializer, 400: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    def get(self, request: Request, changeset_id: str) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        limit = paging.page_size(request)
        changeset = get_visible_changeset(request, changeset_id)
        after = _after_revision(request, "changeset-revisions", changeset)
        rows = changeset_revisions(
            changeset=changeset,
            namespaces=access.readable_namespaces(request.user),
            after_id=after,
            limit=limit + 1,
        )
        next_token = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_token = _next_token(request, "changeset-revisions", changeset, rows[-1].id)
        return Response(
            {
                "results": [revision_repr(r, changeset) for r in rows],
                "next_page_token": next_token,
            }
        )


class LogHeadView(APIView):
    permission_classes = [IsAuthenticated]  # API.md: any authenticated user, nobody else

    @extend_schema(
        operation_id="log_head",
        summary="The newest seq and chain hash, to anchor the log elsewhere",
        responses={
            200: inline_serializer(
                "LogHead",
                {
                    "seq": serializers.IntegerField(),
                    "hash": serializers.CharField(),
                    "at": serializers.DateTimeField(allow_null=True),
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        head = LogHead.objects.filter(pk=1).first()
        return Response(
            {
                "seq": head.seq if head else 0,
                "hash": (head.hash if head else "") or GENESIS,
                "at": rfc3339(head.at) if head else None,
            }
        )
