"""``/batch`` and ``/delete-by-query``: many entities, one changeset.

Each keeps its own path (API.md), so each is a small viewset whose ``create``
answers POST on the router's list route.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import strict
from atlas.api.auth import actor
from atlas.api.branch import store_for
from atlas.api.idempotency import idempotent
from atlas.api.openapi import BRANCH_PARAM, IDEMPOTENCY_PARAM, PROBLEM
from atlas.api.provenance import request_context
from atlas.api.representations import ChangesetSerializer
from atlas.api.viewsets import ViewSet
from changesets.models import Rpc
from changesets.services.apply import changeset_apply
from changesets.services.delete_by_query import entities_delete_by_query
from entities.api import serializers as s
from entities.api.batch import BatchBodySerializer, parse_batch
from entities.api.responses import WRITE_ERRORS, WRITE_STATUSES, changeset_or_none

BatchResponseSerializer = inline_serializer(
    "BatchResponse",
    {
        "changeset": ChangesetSerializer(allow_null=True),
        "results": inline_serializer(
            "BatchOpResult",
            {
                "pointer": serializers.CharField(),
                "status": serializers.ChoiceField(WRITE_STATUSES),
                "version": serializers.IntegerField(allow_null=True),
            },
            many=True,
        ),
        "dry_run": serializers.BooleanField(),
    },
)


# (Comments, not docstrings, on viewsets: drf-spectacular prints a viewset's
# docstring as the description of each of its operations.)


# ``POST /batch``: an ordered op list as one changeset, all or nothing.
class BatchViewSet(ViewSet):
    @extend_schema(
        operation_id="batch",
        summary="Apply an ordered op list as one changeset (all or nothing)",
        request=BatchBodySerializer,
        parameters=[BRANCH_PARAM, IDEMPOTENCY_PARAM],
        responses={200: BatchResponseSerializer, **{code: PROBLEM for code in WRITE_ERRORS}},
    )
    @idempotent
    def create(self, request: Request) -> Response:
        store = store_for(request)
        ops, comment, dry_run, metadata = parse_batch(request.data)
        result = changeset_apply(
            store=store,
            actor=actor(request),
            ops=ops,
            rpc=Rpc.BATCH_MUTATE,
            comment=comment,
            dry_run=dry_run,
            metadata=metadata,
            context=request_context(request),
        )
        return Response(
            {
                "changeset": changeset_or_none(result),
                "results": [
                    {"pointer": r.pointer, "status": r.status, "version": r.version}
                    for r in result.results
                ],
                "dry_run": dry_run,
            }
        )


# ``POST /delete-by-query``: every matching entity deleted as one changeset.
class DeleteByQueryViewSet(ViewSet):
    @extend_schema(
        operation_id="delete_by_query",
        summary="Delete every matching entity as one changeset",
        request=s.DeleteByQueryBodySerializer,
        parameters=[BRANCH_PARAM, IDEMPOTENCY_PARAM],
        responses={
            200: inline_serializer(
                "DeleteByQueryResponse",
                {
                    "changeset": ChangesetSerializer(allow_null=True),
                    "deleted": serializers.IntegerField(),
                    "dry_run": serializers.BooleanField(),
                },
            ),
            **{code: PROBLEM for code in (400, 403, 404, 413, 415, 422)},
        },
    )
    @idempotent
    def create(self, request: Request) -> Response:
        store = store_for(request)
        query = strict.validated(s.DeleteByQueryBodySerializer, request.data)
        done = entities_delete_by_query(
            store=store,
            actor=actor(request),
            namespace=query["namespace"],
            kind=query.get("kind"),
            slug_prefix=query.get("slug_prefix"),
            comment=query.get("comment") or "",
            dry_run=query["dry_run"],
            metadata=query.get("metadata"),
            context=request_context(request),
        )
        return Response(
            {
                "changeset": changeset_or_none(done.applied),
                "deleted": done.deleted,
                "dry_run": query["dry_run"],
            }
        )
