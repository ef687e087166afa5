"""Shapes of the change feed and of subscriptions, and the subscription bodies.

Records and pages are rendered by :mod:`changesets.feed`; subscriptions by
the functions at the end. The serializers describe those shapes for the
OpenAPI schema; the body serializers are :mod:`atlas.api.strict` ones, which
validate what they describe.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field, extend_schema_serializer, inline_serializer
from rest_framework import serializers
from rest_framework.fields import empty

from atlas.api import strict
from atlas.api.inputs import namespace_field
from atlas.api.render import rfc3339
from atlas.api.representations import ArchivedBeforeSerializer, WithContextField
from changesets.models import Capture, Subscription
from changesets.outbox import subscriptions as subs
from changesets.selectors import feed
from entities import validation as v

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


# One feed record (changesets.selectors.feed); the base adds ``context``.
@extend_schema_serializer(component_name="FeedRecord")
class FeedRecordSchema(WithContextField):
    event_id = serializers.CharField(help_text="<changeset_id>:<ns>/<kind>/<slug>")
    changeset_id = serializers.UUIDField()
    seq = serializers.IntegerField()
    at = serializers.DateTimeField()
    author = serializers.CharField()
    rpc = serializers.CharField()
    op = serializers.ChoiceField(choices=["create", "update", "delete"])
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    version = serializers.IntegerField(allow_null=True)
    changed = serializers.ListField(
        child=serializers.CharField(),
        help_text="RFC 6901 pointers of what changed (docs/history.md)",
    )
    metadata = serializers.DictField(help_text="The changeset's client metadata ({})")
    new_values = serializers.DictField(required=False)
    new_row = serializers.DictField(required=False, allow_null=True)
    old_values = serializers.DictField(required=False)


FeedRecordSerializer = FeedRecordSchema()


@extend_schema_serializer(many=False)
class FeedPageSerializer(serializers.Serializer):
    records = FeedRecordSerializer.__class__(many=True)
    next_cursor = serializers.CharField()
    watermark = WatermarkSerializer
    capture = serializers.ChoiceField(choices=CAPTURES)
    archived_before = ArchivedBeforeSerializer(
        required=False, help_text="Present when the page starts at an archive cut."
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


@extend_schema_serializer(many=False)
class SubscriptionPageSerializer(serializers.Serializer):
    results = SubscriptionSerializer.__class__(many=True)
    next_page_token = serializers.CharField(allow_null=True)


# --- inputs (one serializer each: it validates, and it is the document) ----------------------


@extend_schema_field({"type": "string"})
class _CursorField(serializers.Field):
    """A cursor as sent: :meth:`FeedQuery.validate` decodes it, after every 422."""

    def run_validation(self, data: Any = empty) -> str:
        return str(data)


def _readable_names(names: list[str]) -> list[str]:
    # One error per invalid name, each at ``/namespace`` (the parameter, not an index).
    bad = [("", v.MSG_NAMESPACE) for name in names if not v.is_valid_namespace(name)]
    if bad:
        raise strict.FieldProblem(bad)
    return names


# ``GET /changes``: fields in the order their errors are reported.
class FeedQuery(strict.Query):
    since = _CursorField(
        required=False,
        help_text="A next_cursor from an earlier page; absent = from the beginning.",
    )
    capture = strict.QueryChoiceField(CAPTURES, required=False, default=Capture.NEW_VALUES.value)
    namespace = strict.CheckedListField(
        child=namespace_field(),
        clean=_readable_names,
        required=False,
        help_text="Only these namespaces (repeatable); always limited to readable ones.",
    )
    limit = strict.QueryIntField(
        maximum=feed.MAX_LIMIT,
        default=feed.DEFAULT_LIMIT,
        help_text=f"Default {feed.DEFAULT_LIMIT}, max {feed.MAX_LIMIT}.",
    )

    def refuse(self, errors: list[dict[str, str]]) -> None:
        # As the feed always answered: a bad limit alone, named in the detail (it was
        # checked last and at once); otherwise every error in one 422.
        limit = [error for error in errors if error["pointer"] == "/limit"]
        if limit:
            strict.refuse_naming("limit", limit)
        strict.raise_errors(errors)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # After every 422: a cursor Atlas did not sign is a 400.
        since = attrs.get("since")
        attrs["after_seq"] = feed.cursor_decode(since) if since else 0
        return attrs


MSG_NAME = f"A non-empty string of at most {subs.MAX_NAME_LENGTH} characters, no U+0000."


def _is_name(value: str) -> bool:
    return bool(value.strip()) and "\x00" not in value


def _name_field(**kwargs: Any) -> strict.StrictRegexField:
    # Not blank (a character other than a space), no U+0000.
    return strict.StrictRegexField(
        r"^[^\x00]*[^\x00\s][^\x00]*$",
        max_length=subs.MAX_NAME_LENGTH,
        message=MSG_NAME,
        check=_is_name,
        **kwargs,
    )


def _url_field(**kwargs: Any) -> strict.CheckedRegexField:
    return strict.CheckedRegexField(
        r"^https?://",
        max_length=subs.MAX_URL_LENGTH,
        clean=subs.check_webhook_url,
        help_text="http:// or https:// with a host that resolves (to a public address unless"
        " ATLAS_ALLOW_PRIVATE_WEBHOOKS).",
        **kwargs,
    )


def _namespaces(names: Any) -> list[str]:
    return subs.check_namespaces([] if names is None else names)


def _namespaces_field(**kwargs: Any) -> strict.CheckedListField:
    return strict.CheckedListField(
        child=namespace_field(),
        allow_null=True,
        clean=_namespaces,
        help_text="Existing namespaces; empty, null or absent = all.",
        **kwargs,
    )


def _capture_field() -> strict.StrictChoiceField:
    return strict.StrictChoiceField(CAPTURES, required=False)


# Fields in the order their errors are reported.
class SubscriptionCreateBodySerializer(strict.Body):
    name = _name_field()
    capture = _capture_field()
    active = strict.StrictBooleanField(required=False)
    url = _url_field()
    namespaces = _namespaces_field(required=False)
    start = strict.StrictChoiceField(
        ["beginning", "now"],
        required=False,
        help_text="Where delivery starts: the whole history (default) or the watermark.",
    )


class SubscriptionUpdateBodySerializer(strict.Body):
    name = _name_field(required=False)
    capture = _capture_field()
    active = strict.StrictBooleanField(required=False)
    url = _url_field(required=False)
    namespaces = _namespaces_field(required=False)
    cursor = strict.StrictCharField(
        required=False,
        message="Must be a cursor string from /changes.",
        help_text="Move the cursor (a cursor from /changes): replay or skip.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # After every 422: a cursor that is a string but not one Atlas signed is a 400.
        if "cursor" in attrs:
            attrs["cursor_seq"] = feed.cursor_decode(attrs.pop("cursor"), pointer="/cursor")
        return attrs


# --- representations ---------------------------------------------------------------------


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
