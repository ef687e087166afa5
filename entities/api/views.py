"""Entity endpoints: thin views over ``changesets.services.apply.changeset_apply`` and selectors."""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from atlas.api import paging
from atlas.api.branch import BRANCH_HEADER, store_for
from atlas.api.idempotency import idempotent
from atlas.api.render import parse_rfc3339, rfc3339
from atlas.exceptions import BadRequest, NotFound, PayloadTooLarge, ValidationFailed
from changesets.api.serializers import (
    ChangesetSerializer,
    RevisionPageSerializer,
    changeset_repr,
    revision_repr,
)
from changesets.models import Changeset, Rpc
from changesets.ops import DeleteOp, IfMatch, PatchOp, PutOp
from changesets.selectors import asof
from changesets.selectors.log import entity_has_history, entity_history
from changesets.services.apply import ApplyResult, changeset_apply
from entities import access
from entities import validation as v
from entities.api import serializers as s
from entities.models import Namespace
from entities.store import EntityKey, EntityStore

BRANCH_PARAM = OpenApiParameter(
    BRANCH_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Branch to read or write; absent = baseline. Unknown or invisible → 404.",
)
IDEMPOTENCY_PARAM = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Replays the first response for the same principal, key and request.",
)
# ``If-Match`` (RFC 9110 13.1.1): ``*``, or a list of entity tags, which for
# Atlas are ``"<version>"`` or ``W/"<version>"`` (a version is a canonical
# non-negative integer). A list may hold empty elements and whitespace
# (RFC 9110 5.6.1).
_OWS = r"[ \t]*"
_ETAG = r'(?:W/)?"(?:0|[1-9][0-9]*)"'
IF_MATCH_PATTERN = rf"^{_OWS}(?:\*|(?:,{_OWS})*{_ETAG}(?:{_OWS},(?:{_OWS}{_ETAG})?)*){_OWS}$"
_IF_MATCH_RE = re.compile(IF_MATCH_PATTERN)
_ETAG_VERSION_RE = re.compile(r'"([0-9]+)"')
MSG_IF_MATCH = (
    'Malformed If-Match: expected * or a list of quoted entity tags such as "3" or W/"3".'
)
# Described in words, not as a JSON Schema ``pattern``: Schemathesis 4.32's
# coverage phase cannot draw from this grammar and sends schema-invalid values
# (``0``) as positive data.
IF_MATCH_PARAM = OpenApiParameter(
    "If-Match",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description='"<v>", W/"<v>", a list of them (matches when any does), or *;'
    " anything else is 422 (malformed If-Match).",
)
IF_NONE_MATCH_PARAM = OpenApiParameter(
    "If-None-Match",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="An ETag (or a list of them, or *): 304 when it still matches.",
)
IF_NONE_MATCH_PUT_PARAM = OpenApiParameter(
    "If-None-Match",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    enum=["*"],
    description="* means create-only (412 when the entity exists); nothing else is accepted.",
)
PAGE_PARAMS = [
    OpenApiParameter("page_size", OpenApiTypes.INT, description="Default 50, max 500."),
    OpenApiParameter("page_token", OpenApiTypes.STR, description="Opaque; from next_page_token."),
]
PROBLEM = OpenApiTypes.OBJECT
# Query filters by name: an invalid name is 422 (an empty one means "no filter").
NAMESPACE_SCHEMA = {
    "type": "string",
    "pattern": v.NAMESPACE_RE.pattern,
    "maxLength": v.NAMESPACE_MAX_LENGTH,
}
KIND_SCHEMA = {"type": "string", "pattern": v.KIND_RE.pattern, "maxLength": v.KIND_MAX_LENGTH}

WriteResponseSerializer = inline_serializer(
    "EntityWriteResponse",
    {
        "entity": s.EntitySerializer(allow_null=True),
        "changeset": ChangesetSerializer(allow_null=True),
        "status": serializers.ChoiceField(["created", "updated", "deleted", "unchanged"]),
    },
)


def parse_if_match_header(request: Request) -> IfMatch:
    """``If-Match``: ``*``, or a list of ``"<v>"`` / ``W/"<v>"`` that matches when any does.

    Anything else (``1``, ``"abc"``, an empty value) is malformed: 422 with the
    pointer ``/headers/If-Match``, never a 412 about a version nobody sent.
    """
    raw = request.headers.get("If-Match")
    if raw is None:
        return None
    if not _IF_MATCH_RE.fullmatch(raw):
        raise ValidationFailed(
            MSG_IF_MATCH,
            pointer="/headers/If-Match",
            errors=[{"pointer": "/headers/If-Match", "detail": MSG_IF_MATCH}],
        )
    if raw.strip(" \t") == "*":
        return "*"
    versions = tuple(int(v) for v in _ETAG_VERSION_RE.findall(raw))
    return versions[0] if len(versions) == 1 else versions


def parse_if_none_match_put(request: Request) -> bool:
    raw = request.headers.get("If-None-Match")
    if raw is None:
        return False
    if raw.strip() != "*":
        raise ValidationFailed(
            'On writes, If-None-Match supports only "*" (create-only).',
            errors=[{"pointer": "/headers/If-None-Match", "detail": 'Only "*".'}],
        )
    return True


def path_key(namespace: str, kind: str, slug: str) -> EntityKey:
    """An invalid name in the path names nothing that could exist: 404."""
    if not (v.is_valid_namespace(namespace) and v.is_valid_kind(kind) and v.is_valid_slug(slug)):
        raise NotFound("No such entity.")
    return EntityKey(namespace, kind, slug)


def require_readable(request: Request, namespace: str, what: str = "entity") -> None:
    if not access.can_read(request.user, namespace):
        raise NotFound(f"No such {what}.")


def write_response(result: ApplyResult, key: EntityKey) -> Response:
    entity = result.entities.get(key)
    status_word = result.results[-1].status if result.results else "unchanged"
    body = {
        "entity": s.entity_repr(entity) if entity is not None else None,
        "changeset": (
            changeset_repr(result.changeset, result.revisions) if result.changeset else None
        ),
        "status": status_word,
    }
    response = Response(body, status=201 if status_word == "created" else 200)
    if entity is not None:
        response["ETag"] = s.etag(entity.version)
    return response


AS_OF_PARAMS = [
    OpenApiParameter(
        "as_of",
        OpenApiTypes.UUID,
        description="Read the baseline as it stood right after this changeset.",
    ),
    OpenApiParameter(
        "as_of_time",
        OpenApiTypes.DATETIME,
        description="Read the baseline as of the newest changeset at or before this time.",
    ),
]


def resolve_as_of(request: Request, store: EntityStore) -> Changeset | None:
    """The changeset an as-of read is pinned to, or None for a live read."""
    raw_id = request.query_params.get("as_of")
    raw_time = request.query_params.get("as_of_time")
    if not raw_id and not raw_time:
        return None
    if raw_id and raw_time:
        raise ValidationFailed(
            "Give as_of or as_of_time, not both.",
            errors=[{"pointer": "/as_of_time", "detail": "Conflicts with as_of."}],
        )
    if store.branch:
        raise BadRequest(
            "As-of reads are baseline only; drop the branch header.",
            pointer=f"/headers/{BRANCH_HEADER}",
        )
    namespaces = access.readable_namespaces(request.user)
    if raw_id:
        try:
            uuid.UUID(raw_id)
        except ValueError as exc:
            raise ValidationFailed(
                "as_of must be a changeset id (UUID).",
                errors=[{"pointer": "/as_of", "detail": "Not a UUID."}],
            ) from exc
        changeset = asof.as_of_changeset(changeset_id=raw_id, namespaces=namespaces)
        if changeset is None:
            raise NotFound("No such changeset.", pointer="/as_of")
        if changeset.branch:
            raise BadRequest(
                "As-of reads are baseline only; that changeset landed on a branch.",
                pointer="/as_of",
            )
        return changeset
    at = parse_rfc3339(raw_time or "")
    if at is None:
        raise ValidationFailed(
            "as_of_time must be an RFC 3339 timestamp with offset.",
            errors=[{"pointer": "/as_of_time", "detail": "Not an RFC 3339 timestamp."}],
        )
    changeset = asof.as_of_time(at=at, namespaces=namespaces)
    if changeset is None:
        raise NotFound("No changeset at or before that time.", pointer="/as_of_time")
    return changeset


def as_of_repr(changeset: Changeset) -> dict[str, Any]:
    return {"changeset_id": str(changeset.id), "seq": changeset.seq, "at": rfc3339(changeset.at)}


def _filters_digest(parts: list[Any]) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


class EntityListView(APIView):
    @extend_schema(
        operation_id="entities_list",
        summary="List entities in (namespace, kind, slug) order",
        parameters=[
            OpenApiParameter("namespace", NAMESPACE_SCHEMA),
            OpenApiParameter("kind", KIND_SCHEMA),
            OpenApiParameter(
                "slug_prefix", {"type": "string", "maxLength": 200, "pattern": s.NO_NUL}
            ),
            *PAGE_PARAMS,
            *AS_OF_PARAMS,
            BRANCH_PARAM,
        ],
        responses={200: s.EntityPageSerializer, 400: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    def get(self, request: Request) -> Response:
        paging.check_known_params(
            request,
            {"namespace", "kind", "slug_prefix", "page_size", "page_token", "as_of", "as_of_time"},
        )
        namespace = request.query_params.get("namespace") or None
        kind = request.query_params.get("kind") or None
        slug_prefix = request.query_params.get("slug_prefix") or None
        errors = s.Errors()
        if namespace is not None and not v.is_valid_namespace(namespace):
            errors.add("/namespace", v.MSG_NAMESPACE)
        if kind is not None and not v.is_valid_kind(kind):
            errors.add("/kind", v.MSG_KIND)
        if slug_prefix is not None and (len(slug_prefix) > 200 or "\x00" in slug_prefix):
            errors.add("/slug_prefix", "At most 200 characters, no NUL.")
        errors.raise_if_any()
        store = store_for(request)
        pinned = resolve_as_of(request, store)
        limit = paging.page_size(request)
        digest = _filters_digest(
            [store.branch, namespace, kind, slug_prefix, pinned.seq if pinned else None]
        )
        position = paging.page_position("entities", request)
        after = None
        if position is not None:
            if position.get("f") != digest or not isinstance(position.get("k"), list):
                raise paging.BadRequest(
                    "The page token belongs to another listing.", pointer="/page_token"
                )
            after = EntityKey(*position["k"])
        read = functools.partial(asof.entities_as_of, seq=pinned.seq) if pinned else store.list
        rows = read(
            namespaces=access.readable_namespaces(request.user),
            namespace=namespace,
            kind=kind,
            slug_prefix=slug_prefix,
            after=after,
            limit=limit + 1,
        )
        next_token = None
        if len(rows) > limit:
            rows = rows[:limit]
            last = rows[-1].key
            next_token = paging.encode_token(
                "entities", request, {"k": [last.namespace, last.kind, last.slug], "f": digest}
            )
        body: dict[str, Any] = {
            "results": [s.entity_repr(e) for e in rows],
            "next_page_token": next_token,
        }
        if pinned:
            body["as_of"] = as_of_repr(pinned)
        return Response(body)


class EntityDetailView(APIView):
    @extend_schema(
        operation_id="entities_get",
        summary="One entity (ETag = version)",
        parameters=[BRANCH_PARAM, IF_NONE_MATCH_PARAM, *AS_OF_PARAMS],
        responses={200: s.EntitySerializer, 304: None, 400: PROBLEM, 404: PROBLEM},
    )
    def get(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        paging.check_known_params(request, {"as_of", "as_of_time"})
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        pinned = resolve_as_of(request, store)
        require_readable(request, namespace)
        entity = asof.entity_as_of(seq=pinned.seq, key=key) if pinned else store.get(key)
        if entity is None:
            raise NotFound("No such entity." if not pinned else "No such entity at that point.")
        tag = s.etag(entity.version)
        inm = request.headers.get("If-None-Match")
        if inm and (
            inm.strip() == "*" or tag in [t.strip().removeprefix("W/") for t in inm.split(",")]
        ):
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
            **{code: PROBLEM for code in (400, 403, 404, 409, 412, 413, 415, 422)},
        },
    )
    @idempotent
    def put(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        content, comment = s.parse_put(request.data)
        op = PutOp(
            key,
            content,
            if_match=parse_if_match_header(request),
            if_none_match=parse_if_none_match_put(request),
        )
        result = changeset_apply(
            store=store, actor=request.user, ops=[op], rpc=Rpc.PUT_ENTITY, comment=comment
        )
        return write_response(result, key)

    @extend_schema(
        operation_id="entities_patch",
        summary="RFC 7396 merge patch of an entity's content",
        request=s.PatchBodySerializer,
        parameters=[BRANCH_PARAM, IF_MATCH_PARAM, IDEMPOTENCY_PARAM],
        responses={
            200: WriteResponseSerializer,
            **{code: PROBLEM for code in (400, 403, 404, 409, 412, 413, 415, 422)},
        },
    )
    @idempotent
    def patch(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        patch, comment = s.parse_patch(request.data)
        op = PatchOp(key, patch, if_match=parse_if_match_header(request))
        result = changeset_apply(
            store=store, actor=request.user, ops=[op], rpc=Rpc.PATCH_ENTITY, comment=comment
        )
        return write_response(result, key)

    @extend_schema(
        operation_id="entities_delete",
        summary="Delete an entity (its history stays)",
        request=inline_serializer("DeleteBody", {"comment": s.comment_field()}),
        parameters=[BRANCH_PARAM, IF_MATCH_PARAM, IDEMPOTENCY_PARAM],
        responses={200: WriteResponseSerializer, **{c: PROBLEM for c in (403, 404, 409, 412)}},
    )
    @idempotent
    def delete(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        comment = s.parse_optional_comment(request.data)
        op = DeleteOp(key, if_match=parse_if_match_header(request))
        result = changeset_apply(
            store=store, actor=request.user, ops=[op], rpc=Rpc.DELETE_ENTITY, comment=comment
        )
        return write_response(result, key)


class EntityHistoryView(APIView):
    @extend_schema(
        operation_id="entities_history",
        summary="An entity's revisions, newest first (works after delete)",
        parameters=[*PAGE_PARAMS, BRANCH_PARAM],
        responses={200: RevisionPageSerializer, 400: PROBLEM, 404: PROBLEM},
    )
    def get(self, request: Request, namespace: str, kind: str, slug: str) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        key = path_key(namespace, kind, slug)
        store = store_for(request)
        require_readable(request, namespace)
        limit = paging.page_size(request)
        scope = f"history:{store.branch}:{key}"
        position = paging.page_position(scope, request)
        before_seq = position.get("s") if position else None
        if before_seq is not None and not isinstance(before_seq, int):
            raise paging.BadRequest("The page token is invalid.", pointer="/page_token")
        rows = entity_history(key=key, branch=store.branch, before_seq=before_seq, limit=limit + 1)
        if not rows and position is None and not entity_has_history(key=key, branch=store.branch):
            raise NotFound("No such entity.")
        next_token = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_token = paging.encode_token(scope, request, {"s": rows[-1].seq})
        return Response(
            {"results": [revision_repr(r) for r in rows], "next_page_token": next_token}
        )


BatchResponseSerializer = inline_serializer(
    "BatchResponse",
    {
        "changeset": ChangesetSerializer(allow_null=True),
        "results": inline_serializer(
            "BatchOpResult",
            {
                "pointer": serializers.CharField(),
                "status": serializers.ChoiceField(["created", "updated", "deleted", "unchanged"]),
                "version": serializers.IntegerField(allow_null=True),
            },
            many=True,
        ),
        "dry_run": serializers.BooleanField(),
    },
)


class BatchView(APIView):
    @extend_schema(
        operation_id="batch",
        summary="Apply an ordered op list as one changeset (all or nothing)",
        request=s.BatchBodySerializer,
        parameters=[BRANCH_PARAM, IDEMPOTENCY_PARAM],
        responses={
            200: BatchResponseSerializer,
            **{code: PROBLEM for code in (400, 403, 404, 409, 412, 413, 415, 422)},
        },
    )
    @idempotent
    def post(self, request: Request) -> Response:
        store = store_for(request)
        ops, comment, dry_run = s.parse_batch(request.data)
        result = changeset_apply(
            store=store,
            actor=request.user,
            ops=ops,
            rpc=Rpc.BATCH_MUTATE,
            comment=comment,
            dry_run=dry_run,
        )
        return Response(
            {
                "changeset": (
                    changeset_repr(result.changeset, result.revisions) if result.changeset else None
                ),
                "results": [
                    {"pointer": r.pointer, "status": r.status, "version": r.version}
                    for r in result.results
                ],
                "dry_run": dry_run,
            }
        )


class DeleteByQueryView(APIView):
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
    def post(self, request: Request) -> Response:
        store = store_for(request)
        query = s.parse_delete_by_query(request.data)
        name = query["namespace"]
        namespace = Namespace.objects.filter(name=name).first()
        if namespace is None or not access.can_read(request.user, name):
            raise NotFound(f"Namespace {name!r} not found.", pointer="/namespace")
        access.require_write(request.user, {name: namespace}, branch=store.branch)
        limit = settings.ATLAS_MAX_BATCH_OPS
        matches = store.list(
            namespaces=None,
            namespace=name,
            kind=query["kind"],
            slug_prefix=query["slug_prefix"],
            limit=limit + 1,
        )
        if len(matches) > limit:
            raise PayloadTooLarge(
                f"More than {limit} entities match; narrow the query (kind, slug_prefix).",
                pointer="/namespace",
            )
        result = changeset_apply(
            store=store,
            actor=request.user,
            ops=[DeleteOp(e.key, missing_ok=True) for e in matches],
            rpc=Rpc.DELETE_BY_QUERY,
            comment=query["comment"],
            dry_run=query["dry_run"],
        )
        deleted = sum(1 for r in result.results if r.status == "deleted")
        return Response(
            {
                "changeset": (
                    changeset_repr(result.changeset, result.revisions) if result.changeset else None
                ),
                "deleted": deleted,
                "dry_run": query["dry_run"],
            }
        )
