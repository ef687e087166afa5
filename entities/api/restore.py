"""Restore over HTTP: one entity (``POST /entities/{ns}/{kind}/{slug}/restore``)
or a scope (``POST /restore``).

Thin: validate the body (one serializer each), resolve the point (a version,
or ``as_of``/``as_of_time`` on baseline's history), call one service of
``changesets.services.restore``, render. Under the branch header the restore
is staged on the branch, like every write; the as-of point is still a point
of baseline's history (as-of reads are baseline only), as a revert staged on
a branch still takes its pre-images from the original changeset.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.fields import empty
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import strict
from atlas.api.auth import actor
from atlas.api.branch import store_for
from atlas.api.conditional import etag, parse_if_match_header
from atlas.api.idempotency import idempotent
from atlas.api.inputs import PrefixField, comment_field, kind_field, metadata_field, namespace_field
from atlas.api.keys import AsOfSerializer, ChangesetIdField, InstantField, as_of_repr
from atlas.api.openapi import BRANCH_PARAM, IDEMPOTENCY_PARAM, IF_MATCH_PARAM, PROBLEM
from atlas.api.provenance import request_context
from atlas.api.representations import ChangesetSerializer, changeset_repr
from atlas.api.viewsets import ViewSet
from atlas.exceptions import NotFound, ValidationFailed
from changesets.models import Changeset
from changesets.selectors.asof import as_of_resolve
from changesets.services.restore import entity_restore, scope_restore
from entities import access
from entities.api.lookups import path_key, require_readable
from entities.api.responses import WRITE_ERRORS, WRITE_STATUSES, write_body
from entities.api.serializers import EntitySerializer
from entities.models import Namespace

MSG_VERSION = "Must be a positive integer version."
MSG_ONE_POINT = "Give exactly one of {names}."


class VersionField(serializers.IntegerField):
    """A positive JSON integer (``true`` and ``"3"`` are not versions)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["error_messages"] = {"invalid": MSG_VERSION, "null": MSG_VERSION}
        super().__init__(min_value=1, **kwargs)

    def run_validation(self, data: Any = empty) -> int:
        if isinstance(data, bool) or not isinstance(data, int) or data < 1:
            self.fail("invalid")
        return data


def _one_point(values: dict[str, Any], names: tuple[str, ...]) -> None:
    """Exactly one of ``names`` was given, else 422 at the first one (or the second given)."""
    given = [n for n in names if n in values]
    if len(given) != 1:
        detail = MSG_ONE_POINT.format(names=", ".join(names))
        pointer = f"/{given[1] if len(given) > 1 else names[0]}"
        raise ValidationFailed(
            detail, pointer=pointer, errors=[{"pointer": pointer, "detail": detail}]
        )


# ``POST /entities/{ns}/{kind}/{slug}/restore``: give one of version, as_of, as_of_time.
class EntityRestoreBodySerializer(strict.Body):
    version = VersionField(required=False, help_text="Restore the content it had at this version.")
    as_of = ChangesetIdField(
        required=False, help_text="Restore its state right after this baseline changeset."
    )
    as_of_time = InstantField(
        required=False, help_text="Restore its state at the newest baseline changeset then."
    )
    dry_run = strict.StrictBooleanField(required=False, default=False)
    comment = comment_field()
    metadata = metadata_field()

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        values = super().to_internal_value(data)
        _one_point(values, ("version", "as_of", "as_of_time"))
        return values


# ``POST /restore``: a namespace (narrowed by kind, slug_prefix) back to a point.
class ScopeRestoreBodySerializer(strict.Body):
    namespace = namespace_field()
    kind = kind_field(required=False, allow_null=True)
    slug_prefix = PrefixField()
    as_of = ChangesetIdField(required=False, help_text="The state right after this changeset.")
    as_of_time = InstantField(required=False, help_text="The state at this time.")
    dry_run = strict.StrictBooleanField(required=False, default=False)
    comment = comment_field()
    metadata = metadata_field()

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        values = super().to_internal_value(data)
        _one_point(values, ("as_of", "as_of_time"))
        return values


EntityRestoreResponseSerializer = inline_serializer(
    "EntityRestoreResponse",
    {
        "entity": EntitySerializer(allow_null=True),
        "changeset": ChangesetSerializer(allow_null=True),
        "status": serializers.ChoiceField(WRITE_STATUSES),
        "dry_run": serializers.BooleanField(),
        "restored_version": serializers.IntegerField(
            allow_null=True, help_text="The version restored (null: absent at that point)"
        ),
        "as_of": AsOfSerializer(required=False),
    },
)
ScopeRestoreResponseSerializer = inline_serializer(
    "ScopeRestoreResponse",
    {
        "changeset": ChangesetSerializer(allow_null=True),
        "ops": inline_serializer(
            "RestoreOp",
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
        "as_of": AsOfSerializer(),
    },
)


def _resolve(request: Request, values: dict[str, Any]) -> Changeset:
    """The baseline changeset named by ``as_of`` or ``as_of_time`` (the body has one)."""
    changeset_id: str | None = values.get("as_of")
    at: datetime | None = values.get("as_of_time")
    return as_of_resolve(
        branch="",
        namespaces=access.readable_namespaces(request.user),
        changeset_id=changeset_id,
        at=at,
        name="as_of",
    )


# The restore action of ``EntityViewSet`` (``entities.api.views`` mixes it in).
# (No class docstring: drf-spectacular would make it every operation's description.)
class RestoreActions:
    @extend_schema(
        operation_id="entities_restore",
        summary="Make the entity equal its content at a version or an earlier point",
        request=EntityRestoreBodySerializer,
        parameters=[BRANCH_PARAM, IF_MATCH_PARAM, IDEMPOTENCY_PARAM],
        responses={
            200: EntityRestoreResponseSerializer,
            201: EntityRestoreResponseSerializer,
            **{code: PROBLEM for code in (*WRITE_ERRORS, 410)},
        },
    )
    @action(detail=True, methods=["post"])
    @idempotent
    def restore(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        require_readable(request, namespace)
        body = strict.validated(EntityRestoreBodySerializer, request.data)
        if_match = parse_if_match_header(request)
        done = entity_restore(
            store=store,
            actor=actor(request),
            key=key,
            version=body.get("version"),
            as_of=None if "version" in body else _resolve(request, body),
            if_match=if_match,
            dry_run=body["dry_run"],
            comment=body.get("comment") or "",
            metadata=body.get("metadata"),
            context=request_context(request),
        )
        out = write_body(done.applied, key)
        out["dry_run"] = body["dry_run"]
        out["restored_version"] = done.target.version
        if done.target.as_of is not None:
            out["as_of"] = as_of_repr(done.target.as_of)
        created = out["status"] == "created" and not body["dry_run"]
        response = Response(out, status=201 if created else 200)
        entity = done.applied.entities.get(key)
        if entity is not None and not body["dry_run"]:
            response["ETag"] = etag(entity.version)
        return response


# ``POST /restore``: every entity of a scope back to its state at an earlier point.
class RestoreViewSet(ViewSet):
    @extend_schema(
        operation_id="restore_scope",
        summary="Make every entity of a scope equal its state at an earlier point",
        request=ScopeRestoreBodySerializer,
        parameters=[BRANCH_PARAM, IDEMPOTENCY_PARAM],
        responses={
            200: ScopeRestoreResponseSerializer,
            **{code: PROBLEM for code in (*WRITE_ERRORS, 410)},
        },
    )
    @idempotent
    def create(self, request: Request) -> Response:
        store = store_for(request)
        body = strict.validated(ScopeRestoreBodySerializer, request.data)
        # Not visible = not found, before the point is resolved: a hidden namespace's
        # 404 must not turn into a 404 about the changeset.
        name = body["namespace"]
        if (
            not access.can_read(request.user, name)
            or not Namespace.objects.filter(name=name).exists()
        ):
            raise NotFound(f"Namespace {name!r} not found.", pointer="/namespace")
        as_of = _resolve(request, body)
        result = scope_restore(
            store=store,
            actor=actor(request),
            namespace=body["namespace"],
            kind=body.get("kind"),
            slug_prefix=body.get("slug_prefix"),
            as_of=as_of,
            dry_run=body["dry_run"],
            comment=body.get("comment") or "",
            metadata=body.get("metadata"),
            context=request_context(request),
        )
        namespaces = access.readable_namespaces(request.user)
        changeset = result.changeset
        return Response(
            {
                "changeset": changeset_repr(
                    changeset, result.applied.revisions, namespaces=namespaces
                )
                if changeset
                else None,
                "ops": result.ops,
                "dry_run": body["dry_run"],
                "as_of": as_of_repr(as_of),
            }
        )
