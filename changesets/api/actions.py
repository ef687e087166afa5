"""Changeset actions: revert, NDJSON export and import."""

from __future__ import annotations

from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from atlas.api.branch import store_for
from atlas.api.idempotency import idempotent
from atlas.api.parsers import read_limited
from atlas.exceptions import NotFound, UnsupportedMediaType, ValidationFailed
from changesets import ndjson
from changesets.api.serializers import ChangesetSerializer, changeset_repr
from changesets.api.views import get_visible_changeset
from changesets.selectors.log import changeset_revisions, sees_every_namespace
from changesets.services.interchange import changeset_import
from changesets.services.revert import changeset_revert
from entities import access
from entities.api.serializers import (
    Errors,
    check_bool,
    check_comment,
    check_fields,
    comment_field,
    require_object,
)
from entities.api.views import BRANCH_PARAM, IDEMPOTENCY_PARAM

PROBLEM = OpenApiTypes.OBJECT

ActionResponseSerializer = inline_serializer(
    "ChangesetActionResponse",
    {
        "changeset": ChangesetSerializer(allow_null=True),
        "ops": inline_serializer(
            "InverseOp",
            {
                "op": serializers.ChoiceField(["put", "delete"]),
                "namespace": serializers.CharField(),
                "kind": serializers.CharField(),
                "slug": serializers.CharField(),
                "content": serializers.JSONField(required=False),
            },
            many=True,
        ),
        "dry_run": serializers.BooleanField(),
    },
)


def _action_body(
    request: Request,
    changeset: Any,
    revisions: list[Any],
    ops: list[dict[str, Any]],
    dry_run: bool,
) -> dict[str, Any]:
    """The response of a planned write; its changeset as the caller sees it
    (the caller wrote every op, so in practice all of it)."""
    namespaces = access.readable_namespaces(request.user)
    return {
        "changeset": (
            changeset_repr(changeset, revisions, namespaces=namespaces) if changeset else None
        ),
        "ops": ops,
        "dry_run": dry_run,
    }


class RevertView(APIView):
    @extend_schema(
        operation_id="changesets_revert",
        summary="Undo a changeset as a new changeset",
        request=inline_serializer(
            "RevertBody",
            {
                "dry_run": serializers.BooleanField(required=False, default=False),
                "comment": comment_field(),
            },
        ),
        parameters=[BRANCH_PARAM, IDEMPOTENCY_PARAM],
        responses={
            200: ActionResponseSerializer,
            **{code: PROBLEM for code in (400, 403, 404, 409, 413, 415, 422)},
        },
    )
    @idempotent
    def post(self, request: Request, changeset_id: str) -> Response:
        changeset = get_visible_changeset(request, changeset_id)
        if not sees_every_namespace(changeset, access.readable_namespaces(request.user)):
            # Before the body is read: a hidden op must not make a 422 where a
            # missing changeset is 404 (the service refuses it the same way).
            raise NotFound("No such changeset.")
        store = store_for(request)
        data = require_object(request.data)
        errors = Errors()
        check_fields(data, errors, "", required=set(), optional={"dry_run", "comment"})
        dry_run = check_bool(data, "dry_run", errors)
        comment = check_comment(data, errors)
        errors.raise_if_any()
        result = changeset_revert(
            store=store,
            actor=request.user,
            changeset_id=str(changeset.id),
            dry_run=dry_run,
            comment=comment,
        )
        revisions = result.applied.revisions
        return Response(_action_body(request, result.changeset, revisions, result.ops, dry_run))


class ExportView(APIView):
    @extend_schema(
        operation_id="changesets_export",
        summary="The changeset as NDJSON (envelope line, then one line per op)",
        responses={
            (200, ndjson.MEDIA_TYPE): OpenApiResponse(OpenApiTypes.STR),
            404: PROBLEM,
        },
    )
    def get(self, request: Request, changeset_id: str) -> StreamingHttpResponse:
        changeset = get_visible_changeset(request, changeset_id)
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


class NdjsonParser(BaseParser):
    """Hands the raw body (size-limited) to the view; parsing is the service's, strict."""

    media_type = ndjson.MEDIA_TYPE

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> bytes:
        return read_limited(stream, parser_context)


class _RequiredFileSchema(AutoSchema):
    """The file is the request: an absent body is refused (415 without a Content-Type,
    400 for an empty file), so the OpenAPI document marks the body required."""

    def _get_request_body(self, direction: str = "request") -> dict[str, Any] | None:
        body = super()._get_request_body(direction)
        if body:
            body["required"] = True
        return body


class ImportView(APIView):
    parser_classes = [NdjsonParser]
    schema = _RequiredFileSchema()

    @extend_schema(
        operation_id="changesets_import",
        summary="Apply an exported changeset file as one new changeset",
        request={ndjson.MEDIA_TYPE: OpenApiTypes.STR},
        parameters=[
            OpenApiParameter("dry_run", OpenApiTypes.BOOL, description="Check, write nothing."),
            BRANCH_PARAM,
            IDEMPOTENCY_PARAM,
        ],
        responses={
            200: ActionResponseSerializer,
            **{code: PROBLEM for code in (400, 403, 404, 409, 413, 415, 422)},
        },
    )
    @idempotent
    def post(self, request: Request) -> Response:
        raw_dry_run = request.query_params.get("dry_run", "false").lower()
        if raw_dry_run not in ("true", "false", "1", "0", ""):
            raise ValidationFailed(
                "dry_run must be true or false.",
                errors=[{"pointer": "/dry_run", "detail": "Must be true or false."}],
            )
        dry_run = raw_dry_run in ("true", "1")
        if request.content_type.split(";")[0].strip() != ndjson.MEDIA_TYPE:
            raise UnsupportedMediaType(f"Send the file as {ndjson.MEDIA_TYPE}.")
        store = store_for(request)
        # An empty body never reaches the parser: DRF hands the view an empty dict.
        body = request.data if isinstance(request.data, bytes | str) else b""
        document = ndjson.parse(body)
        result = changeset_import(
            store=store, actor=request.user, document=document, dry_run=dry_run
        )
        revisions = result.applied.revisions
        return Response(_action_body(request, result.changeset, revisions, result.ops, dry_run))
