"""``POST /erase`` and ``GET /erasures`` (API.md "Erasure").

Thin: one body serializer, one service (``changesets.services.erase``), one
selector-like page of erasure rows.
"""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema, extend_schema_serializer, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import paging, strict
from atlas.api.auth import actor
from atlas.api.idempotency import idempotent
from atlas.api.inputs import kind_field, namespace_field, slug_field
from atlas.api.openapi import IDEMPOTENCY_PARAM, PAGE_PARAMS, PROBLEM
from atlas.api.provenance import request_context
from atlas.api.render import rfc3339
from atlas.api.representations import ChangesetSerializer, changeset_repr
from atlas.api.viewsets import ViewSet
from changesets.models import Changeset, Erasure
from changesets.selectors.log import revisions_of
from changesets.services.erase import MSG_POINTER, EraseTarget, entities_erase
from entities import access
from entities.store import EntityKey

# An RFC 6901 pointer to a member: one or more "/segment"s ("~" only as "~0" or "~1";
# no NUL, which no JSON text Atlas stores can hold).
POINTER_PATTERN = r"^(/([^~/\u0000]|~[01])*)+$"


class EraseTargetSerializer(strict.Body):
    namespace = namespace_field()
    kind = kind_field()
    slug = slug_field()
    pointers = serializers.ListField(
        # The pattern states the rule in the schema (the service checks it again).
        child=serializers.CharField(
            allow_blank=False,
            trim_whitespace=False,
            max_length=2000,
            validators=[RegexValidator(POINTER_PATTERN, message=MSG_POINTER)],
        ),
        min_length=1,
        max_length=1000,
        help_text="RFC 6901 pointers into the content, like /email",
    )


class EraseBodySerializer(strict.Body):
    targets = serializers.ListField(child=EraseTargetSerializer(), min_length=1)
    reason = strict.StrictCharField(max_length=2000)
    dry_run = strict.StrictBooleanField(required=False, default=False)


class ErasureSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    author = serializers.CharField()
    at = serializers.DateTimeField()
    reason = serializers.CharField()
    targets = inline_serializer(
        "ErasureTarget",
        {
            "namespace": serializers.CharField(),
            "kind": serializers.CharField(),
            "slug": serializers.CharField(),
            "pointers": serializers.ListField(child=serializers.CharField()),
        },
        many=True,
    )
    revisions_redacted = serializers.IntegerField()


def erasure_repr(erasure: Erasure) -> dict[str, Any]:
    return {
        "id": str(erasure.id),
        "author": erasure.author_name,
        "at": rfc3339(erasure.at),
        "reason": erasure.reason,
        "targets": erasure.targets,
        "revisions_redacted": erasure.revisions_redacted,
    }


def _changeset(changeset: Changeset | None) -> dict[str, Any] | None:
    if changeset is None:
        return None
    return changeset_repr(changeset, revisions_of(changeset).order_by("id"))


# ``POST /erase``: erase values at pointers everywhere Atlas holds them.
class EraseViewSet(ViewSet):
    @extend_schema(
        operation_id="erase",
        summary="Erase values at pointers everywhere Atlas holds them (maintainers)",
        request=EraseBodySerializer,
        parameters=[IDEMPOTENCY_PARAM],
        responses={
            200: inline_serializer(
                "EraseResponse",
                {
                    "erasure": ErasureSerializer(),
                    "changeset": ChangesetSerializer(allow_null=True),
                    "branch_changesets": ChangesetSerializer(many=True),
                    "dry_run": serializers.BooleanField(),
                },
            ),
            **{code: PROBLEM for code in (400, 403, 404, 413, 415, 422)},
        },
    )
    @idempotent
    def create(self, request: Request) -> Response:
        body = strict.validated(EraseBodySerializer, request.data)
        targets = [
            EraseTarget(EntityKey(t["namespace"], t["kind"], t["slug"]), tuple(t["pointers"]))
            for t in body["targets"]
        ]
        result = entities_erase(
            actor=actor(request),
            targets=targets,
            reason=body["reason"],
            dry_run=body["dry_run"],
            context=request_context(request),
        )
        return Response(
            {
                "erasure": erasure_repr(result.erasure),
                "changeset": _changeset(result.changeset),
                "branch_changesets": [_changeset(c) for c in result.branch_changesets],
                "dry_run": result.dry_run,
            }
        )


# A page is one object, though ``list`` answers it (many=False keeps drf-spectacular
# from describing an array of pages).
@extend_schema_serializer(many=False)
class ErasurePageSerializer(serializers.Serializer):
    results = ErasureSerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)


# ``GET /erasures``: erasures whose namespaces the caller can all read, newest first.
class ErasuresViewSet(ViewSet):
    @extend_schema(
        operation_id="erasures_list",
        summary="Erasures (who, when, why, which pointers; never the values), newest first",
        parameters=PAGE_PARAMS,
        responses={
            200: ErasurePageSerializer,
            **{code: PROBLEM for code in (400, 422)},
        },
    )
    def list(self, request: Request) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        readable = access.readable_namespaces(request.user)

        def fetch(after: Any, limit: int) -> list[Erasure]:
            rows = Erasure.objects.order_by("-id")
            if readable is not None:
                rows = rows.filter(namespaces__contained_by=readable)
            if after is not None:
                rows = rows.filter(id__lt=after)
            return list(rows[:limit])

        page = paging.keyset_page(
            request,
            scope="erasures",
            field="id",
            field_type=str,
            fetch=fetch,
            position_of=lambda e: str(e.id),
        )
        return Response(
            {
                "results": [erasure_repr(e) for e in page.results],
                "next_page_token": page.next_page_token,
            }
        )
