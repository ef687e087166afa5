"""The change feed (``GET /changes``) and subscriptions (superusers): thin views.

Parsing and rendering here; reads in :mod:`changesets.selectors.feed`, writes in
:mod:`changesets.outbox.subscriptions`.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from atlas.api import paging
from atlas.api.idempotency import idempotent
from atlas.api.render import rfc3339
from atlas.exceptions import NotFound, PermissionDenied, ValidationFailed
from changesets.models import Capture, Changeset, Subscription
from changesets.outbox import metrics
from changesets.outbox import subscriptions as subs
from changesets.selectors import feed
from entities import access
from entities import validation as v
from entities.api.serializers import Errors, check_fields, namespace_field, require_object
from entities.api.views import NAMESPACE_SCHEMA

PROBLEM = OpenApiTypes.OBJECT
CAPTURES = [c.value for c in Capture]

# --- schema shapes ---------------------------------------------------------------------------

WatermarkSerializer = inline_serializer(
    "FeedWatermark",
    {
        "seq": serializers.IntegerField(),
        "changeset_id": serializers.UUIDField(
            allow_null=True,
            help_text="null on an empty log, or when you cannot see that changeset",
        ),
        "at": serializers.DateTimeField(allow_null=True),
    },
)

FeedRecordSerializer = inline_serializer(
    "FeedRecord",
    {
        "event_id": serializers.CharField(help_text="<changeset_id>:<ns>/<kind>/<slug>"),
        "changeset_id": serializers.UUIDField(),
        "seq": serializers.IntegerField(),
        "at": serializers.DateTimeField(),
        "author": serializers.CharField(),
        "rpc": serializers.CharField(),
        "op": serializers.ChoiceField(choices=["create", "update", "delete"]),
        "namespace": serializers.CharField(),
        "kind": serializers.CharField(),
        "slug": serializers.CharField(),
        "version": serializers.IntegerField(allow_null=True),
        "new_values": serializers.DictField(required=False),
        "new_row": serializers.DictField(required=False, allow_null=True),
        "old_values": serializers.DictField(required=False),
    },
)

FeedPageSerializer = inline_serializer(
    "FeedPage",
    {
        "records": FeedRecordSerializer.__class__(many=True),
        "next_cursor": serializers.CharField(),
        "watermark": WatermarkSerializer,
        "capture": serializers.ChoiceField(choices=CAPTURES),
    },
)

_SUBSCRIPTION_FIELDS: dict[str, serializers.Field] = {
    "id": serializers.UUIDField(),
    "name": serializers.CharField(),
    "url": serializers.CharField(),
    "namespaces": serializers.ListField(child=serializers.CharField()),
    "capture": serializers.ChoiceField(choices=CAPTURES),
    "active": serializers.BooleanField(),
    "cursor": serializers.CharField(),
    "lag": serializers.IntegerField(),
    "last_delivery_at": serializers.DateTimeField(allow_null=True),
    "last_error": serializers.CharField(),
    "consecutive_failures": serializers.IntegerField(),
    "next_attempt_at": serializers.DateTimeField(allow_null=True),
    "deliveries": inline_serializer(
        "SubscriptionDeliveries",
        {"ok": serializers.IntegerField(), "failed": serializers.IntegerField()},
    ),
    "parked": inline_serializer(
        "SubscriptionParked",
        {
            "seq": serializers.IntegerField(help_text="The changeset whose delivery gave up."),
            "part": serializers.IntegerField(
                allow_null=True, help_text="Which part of it, when it goes in parts."
            ),
            "error": serializers.CharField(),
            "attempts": serializers.IntegerField(
                help_text="0 when it could not be sent at all (a record over the body limit)."
            ),
            "at": serializers.DateTimeField(),
        },
        allow_null=True,
        help_text="The dead letter; null when nothing is parked. POST retry or skip.",
    ),
    "previous_secret_expires_at": serializers.DateTimeField(
        allow_null=True,
        help_text="After rotate-secret: the old secret also signs until then; else null.",
    ),
    "created_at": serializers.DateTimeField(),
    "updated_at": serializers.DateTimeField(),
}
SubscriptionSerializer = inline_serializer("Subscription", _SUBSCRIPTION_FIELDS)
SubscriptionCreatedSerializer = inline_serializer(
    "SubscriptionCreated",
    {**_SUBSCRIPTION_FIELDS, "secret": serializers.CharField(help_text="Shown only here.")},
)
SubscriptionPageSerializer = inline_serializer(
    "SubscriptionPage",
    {
        "results": SubscriptionSerializer.__class__(many=True),
        "next_page_token": serializers.CharField(allow_null=True),
    },
)


def _name_field(**kwargs: Any) -> serializers.RegexField:
    # Not blank (a character other than a space), no U+0000.
    return serializers.RegexField(
        r"^[^\x00]*[^\x00\s][^\x00]*$", max_length=subs.MAX_NAME_LENGTH, **kwargs
    )


def _url_field(**kwargs: Any) -> serializers.CharField:
    return serializers.RegexField(
        r"^https?://",
        max_length=subs.MAX_URL_LENGTH,
        help_text="http:// or https:// with a host that resolves (to a public address unless"
        " ATLAS_ALLOW_PRIVATE_WEBHOOKS).",
        **kwargs,
    )


def _namespaces_field(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=namespace_field(),
        allow_null=True,
        help_text="Existing namespaces; empty, null or absent = all.",
        **kwargs,
    )


SubscriptionCreateBody = inline_serializer(
    "SubscriptionCreateBody",
    {
        "name": _name_field(),
        "url": _url_field(),
        "namespaces": _namespaces_field(required=False),
        "capture": serializers.ChoiceField(choices=CAPTURES, required=False),
        "active": serializers.BooleanField(required=False),
        "start": serializers.ChoiceField(
            choices=["beginning", "now"],
            required=False,
            help_text="Where delivery starts: the whole history (default) or the watermark.",
        ),
    },
)
SubscriptionUpdateBody = inline_serializer(
    "SubscriptionUpdateBody",
    {
        "name": _name_field(required=False),
        "url": _url_field(required=False),
        "namespaces": _namespaces_field(required=False),
        "capture": serializers.ChoiceField(choices=CAPTURES, required=False),
        "active": serializers.BooleanField(required=False),
        "cursor": serializers.CharField(
            required=False, help_text="Move the cursor (a cursor from /changes): replay or skip."
        ),
    },
)

# --- the pull feed ---------------------------------------------------------------------------


class ChangeFeedView(APIView):
    @extend_schema(
        operation_id="changes_list",
        summary="The change feed: baseline changes after a cursor, in commit order",
        parameters=[
            OpenApiParameter(
                "since",
                OpenApiTypes.STR,
                description="A next_cursor from an earlier page; absent = from the beginning.",
            ),
            OpenApiParameter("capture", OpenApiTypes.STR, enum=CAPTURES),
            OpenApiParameter(
                "namespace",
                {"type": "array", "items": NAMESPACE_SCHEMA},
                style="form",
                explode=True,
                description="Only these namespaces (repeatable); always limited to readable ones.",
            ),
            OpenApiParameter("limit", OpenApiTypes.INT, description="Default 100, max 1000."),
        ],
        responses={200: FeedPageSerializer, 400: PROBLEM, 422: PROBLEM},
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        paging.check_known_params(request, {"since", "capture", "namespace", "limit"})
        errors = Errors()
        capture = params.get("capture") or Capture.NEW_VALUES
        if capture not in CAPTURES:
            errors.add("/capture", f"One of {', '.join(CAPTURES)}.")
        requested = [n for n in params.getlist("namespace") if n != ""] or None
        for name in requested or []:
            if not v.is_valid_namespace(name):
                errors.add("/namespace", v.MSG_NAMESPACE)
        limit = paging.int_param(
            request, "limit", default=feed.DEFAULT_LIMIT, maximum=feed.MAX_LIMIT
        )
        errors.raise_if_any()
        since = params.get("since")
        after_seq = feed.cursor_decode(since) if since else 0
        readable = access.readable_namespaces(request.user)
        namespaces = feed.effective_namespaces(readable, requested)
        with metrics.feed_page_timer("pull"):
            page = feed.feed_page(
                after_seq=after_seq, namespaces=namespaces, capture=capture, limit=limit
            )
        body = page.as_dict()
        mark = body["watermark"]
        if mark["changeset_id"] and readable is not None:
            # seq and at stay global (the log's position, public at /log/head); the id of
            # a changeset the reader cannot see is not shown (not visible = not there).
            seen = Changeset.objects.filter(pk=mark["changeset_id"], namespaces__overlap=readable)
            if not readable or not seen.exists():
                body["watermark"] = {**mark, "changeset_id": None}
        if not page.records and since:
            body["next_cursor"] = since  # an empty page keeps the reader where it was
        return Response(body)


# --- subscriptions (superusers) --------------------------------------------------------------


class IsSuperuser(BasePermission):
    """Subscriptions see every namespace's changes, so only superusers manage them
    (``is_staff`` alone grants nothing here)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        if not access.is_superuser(request.user):
            raise PermissionDenied("Subscriptions are managed by superusers.")
        return True


def parked_repr(subscription: Subscription) -> dict[str, Any] | None:
    if subscription.parked_seq is None:
        return None
    return {
        "seq": subscription.parked_seq,
        "part": subscription.parked_part,
        "error": subscription.parked_error,
        "attempts": subscription.parked_attempts,
        "at": rfc3339(subscription.parked_at),
    }


def subscription_repr(subscription: Subscription, *, secret: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": str(subscription.id),
        "name": subscription.name,
        "url": subscription.url,
        "namespaces": list(subscription.namespaces),
        "capture": subscription.capture,
        "active": subscription.active,
        "cursor": feed.cursor_encode(subscription.cursor_seq),
        "lag": subs.subscription_lag(subscription),
        "last_delivery_at": rfc3339(subscription.last_delivery_at),
        "last_error": subscription.last_error,
        "consecutive_failures": subscription.consecutive_failures,
        "next_attempt_at": rfc3339(subscription.next_attempt_at),
        "deliveries": {
            "ok": subscription.deliveries_ok,
            "failed": subscription.deliveries_failed,
        },
        "parked": parked_repr(subscription),
        "previous_secret_expires_at": _overlap_end(subscription),
        "created_at": rfc3339(subscription.created_at),
        "updated_at": rfc3339(subscription.updated_at),
    }
    if secret:
        body["secret"] = subscription.secret
    return body


def _overlap_end(subscription: Subscription) -> str | None:
    expires = subscription.previous_secret_expires_at
    if not subscription.previous_secret or expires is None or expires <= timezone.now():
        return None
    return rfc3339(expires)


def _check_name(body: dict[str, Any], errors: Errors) -> None:
    name = body.get("name")
    if (
        not isinstance(name, str)
        or not name.strip()
        or len(name) > subs.MAX_NAME_LENGTH
        or "\x00" in name
    ):
        errors.add(
            "/name", f"A non-empty string of at most {subs.MAX_NAME_LENGTH} characters, no U+0000."
        )


def _parse_common(body: dict[str, Any], errors: Errors) -> dict[str, Any]:
    """Validate the fields create and update share; returns the service arguments."""
    out: dict[str, Any] = {}
    if "name" in body:
        _check_name(body, errors)
        out["name"] = body.get("name")
    if "capture" in body:
        if body["capture"] not in CAPTURES:
            errors.add("/capture", f"One of {', '.join(CAPTURES)}.")
        out["capture"] = body["capture"]
    if "active" in body:
        if not isinstance(body["active"], bool):
            errors.add("/active", "Must be true or false.")
        out["active"] = body["active"]
    if "url" in body:
        try:
            out["url"] = subs.check_webhook_url(body["url"])
        except ValidationFailed as exc:
            for item in exc.errors or []:
                errors.add(item["pointer"], item["detail"])
    if "namespaces" in body:
        if body["namespaces"] is None:
            body["namespaces"] = []
        try:
            out["namespaces"] = subs.check_namespaces(body["namespaces"])
        except ValidationFailed as exc:
            for item in exc.errors or []:
                errors.add(item["pointer"], item["detail"])
    return out


def _get_subscription(subscription_id: str) -> Subscription:
    try:
        uuid.UUID(subscription_id)
    except ValueError as exc:
        raise NotFound("No such subscription.") from exc
    subscription = subs.subscription_get(subscription_id=subscription_id)
    if subscription is None:
        raise NotFound("No such subscription.")
    return subscription


class SubscriptionListView(APIView):
    permission_classes = [IsSuperuser]

    @extend_schema(
        operation_id="subscriptions_list",
        summary="Subscriptions (superusers)",
        parameters=[
            OpenApiParameter("page_size", OpenApiTypes.INT),
            OpenApiParameter("page_token", OpenApiTypes.STR),
        ],
        responses={200: SubscriptionPageSerializer, 400: PROBLEM, 403: PROBLEM},
    )
    def get(self, request: Request) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        limit = paging.page_size(request)
        position = paging.page_position("subscriptions", request)
        after_id = None
        if position is not None:
            after_id = position.get("i")
            if not isinstance(after_id, str):
                raise paging.BadRequest("The page token is invalid.", pointer="/page_token")
        rows = list(subs.subscription_list(after_id=after_id)[: limit + 1])
        token = None
        if len(rows) > limit:
            rows = rows[:limit]
            token = paging.encode_token("subscriptions", request, {"i": str(rows[-1].id)})
        return Response({"results": [subscription_repr(s) for s in rows], "next_page_token": token})

    @extend_schema(
        operation_id="subscriptions_create",
        summary="Create a subscription (superusers); the secret is shown only in this response",
        request=SubscriptionCreateBody,
        responses={201: SubscriptionCreatedSerializer, 403: PROBLEM, 422: PROBLEM},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        body = require_object(request.data)
        errors = Errors()
        check_fields(
            body,
            errors,
            "",
            required={"name", "url"},
            optional={"namespaces", "capture", "active", "start"},
        )
        args = _parse_common(body, errors)
        start = body.get("start", "beginning")
        if start not in ("beginning", "now"):
            errors.add("/start", "One of beginning, now.")
        errors.raise_if_any()
        subscription = subs.subscription_create(actor=request.user, start=start, **args)
        return Response(subscription_repr(subscription, secret=True), status=201)


class SubscriptionDetailView(APIView):
    permission_classes = [IsSuperuser]

    @extend_schema(
        operation_id="subscriptions_get",
        summary="One subscription (superusers)",
        responses={200: SubscriptionSerializer, 403: PROBLEM, 404: PROBLEM},
    )
    def get(self, request: Request, subscription_id: str) -> Response:
        return Response(subscription_repr(_get_subscription(subscription_id)))

    @extend_schema(
        operation_id="subscriptions_update",
        summary="Change a subscription (superusers); moving the cursor replays or skips",
        request=SubscriptionUpdateBody,
        responses={
            200: SubscriptionSerializer,
            400: PROBLEM,
            403: PROBLEM,
            404: PROBLEM,
            422: PROBLEM,
        },
    )
    @idempotent
    def patch(self, request: Request, subscription_id: str) -> Response:
        subscription = _get_subscription(subscription_id)
        body = require_object(request.data)
        errors = Errors()
        check_fields(
            body,
            errors,
            "",
            required=set(),
            optional={"name", "url", "namespaces", "capture", "active", "cursor"},
        )
        changes = _parse_common(body, errors)
        cursor = body.get("cursor")
        if "cursor" in body and not isinstance(cursor, str):
            errors.add("/cursor", "Must be a cursor string from /changes.")
        errors.raise_if_any()
        if isinstance(cursor, str):
            changes["cursor_seq"] = feed.cursor_decode(cursor, pointer="/cursor")
        subscription = subs.subscription_update(subscription_id=subscription.id, changes=changes)
        return Response(subscription_repr(subscription))

    @extend_schema(
        operation_id="subscriptions_delete",
        summary="Delete a subscription (superusers)",
        responses={204: None, 403: PROBLEM, 404: PROBLEM},
    )
    @idempotent
    def delete(self, request: Request, subscription_id: str) -> Response:
        subscription = _get_subscription(subscription_id)
        subs.subscription_delete(subscription_id=subscription.id)
        return Response(status=204)


def _no_body(request: Request) -> None:
    """The actions take no fields: no body, or an empty object (anything else is 422)."""
    if request.data in (None, b"", "") or (hasattr(request.data, "dict") and not request.data):
        return
    errors = Errors()
    check_fields(require_object(request.data), errors, "", required=set(), optional=set())
    errors.raise_if_any()


class SubscriptionRotateSecretView(APIView):
    permission_classes = [IsSuperuser]

    @extend_schema(
        operation_id="subscriptions_rotate_secret",
        summary="New secret (superusers); the old one also signs for the overlap window",
        request=None,
        responses={200: SubscriptionCreatedSerializer, 403: PROBLEM, 404: PROBLEM},
    )
    @idempotent
    def post(self, request: Request, subscription_id: str) -> Response:
        subscription = _get_subscription(subscription_id)
        _no_body(request)
        subscription = subs.subscription_rotate_secret(
            subscription_id=subscription.id, actor=request.user
        )
        return Response(subscription_repr(subscription, secret=True))


class SubscriptionRetryView(APIView):
    permission_classes = [IsSuperuser]

    @extend_schema(
        operation_id="subscriptions_retry",
        summary="Deliver the parked changeset again (superusers)",
        request=None,
        responses={200: SubscriptionSerializer, 403: PROBLEM, 404: PROBLEM, 409: PROBLEM},
    )
    @idempotent
    def post(self, request: Request, subscription_id: str) -> Response:
        subscription = _get_subscription(subscription_id)
        _no_body(request)
        subscription = subs.subscription_retry(subscription_id=subscription.id, actor=request.user)
        return Response(subscription_repr(subscription))


class SubscriptionSkipView(APIView):
    permission_classes = [IsSuperuser]

    @extend_schema(
        operation_id="subscriptions_skip",
        summary="Move the cursor past the parked changeset (superusers)",
        request=None,
        responses={200: SubscriptionSerializer, 403: PROBLEM, 404: PROBLEM, 409: PROBLEM},
    )
    @idempotent
    def post(self, request: Request, subscription_id: str) -> Response:
        subscription = _get_subscription(subscription_id)
        _no_body(request)
        subscription = subs.subscription_skip(subscription_id=subscription.id, actor=request.user)
        return Response(subscription_repr(subscription))
