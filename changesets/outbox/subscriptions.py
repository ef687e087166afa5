"""Subscriptions: push consumers of the change feed (services and reads).

A subscription is a server-side reader of the feed with a durable cursor;
:mod:`changesets.outbox.pumps` runs its deliveries. These services only
create, change and delete the rows, and wake the pump after commit when there
may be something new to deliver.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from atlas import conf
from atlas.api.render import rfc3339
from atlas.exceptions import Conflict, NotFound, ValidationFailed
from changesets.archive import boundary
from changesets.models import Capture, Subscription
from changesets.outbox import pumps
from changesets.outbox.webhooks import UnsafeAddress, new_secret, resolve_webhook_host
from changesets.selectors import feed
from entities import validation as v
from entities.models import Namespace

logger = logging.getLogger(__name__)

MAX_URL_LENGTH = 2000
MAX_NAME_LENGTH = 200

MSG_URL_SCHEME = "Must be an http:// or https:// URL with a host."
MSG_URL_PRIVATE = (
    "Resolves to a loopback, private or otherwise non-public address; "
    "refused unless ATLAS_ALLOW_PRIVATE_WEBHOOKS is on."
)
MSG_URL_UNRESOLVABLE = "The host name does not resolve."
MSG_NAMESPACE_MISSING = "No such namespace."
MSG_NOTHING_PARKED = "Nothing is parked on this subscription."


def check_webhook_url(url: Any, *, pointer: str = "/url") -> str:
    """Validate a webhook URL (scheme, host, and the private-address rule); 422 if bad."""

    def invalid(detail: str) -> ValidationFailed:
        return ValidationFailed(
            detail, pointer=pointer, errors=[{"pointer": pointer, "detail": detail}]
        )

    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH or not url.isprintable():
        raise invalid(MSG_URL_SCHEME)
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise invalid(MSG_URL_SCHEME) from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
        raise invalid(MSG_URL_SCHEME)
    try:
        resolve_webhook_host(parts.hostname, port)
    except UnsafeAddress as exc:
        raise invalid(MSG_URL_PRIVATE) from exc
    except (OSError, UnicodeError) as exc:
        raise invalid(MSG_URL_UNRESOLVABLE) from exc
    return url


def check_namespaces(names: Any, *, pointer: str = "/namespaces") -> list[str]:
    """A list of existing namespace names (deduplicated, sorted); 422 otherwise."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        detail = "Must be a list of namespace names."
        raise ValidationFailed(
            detail, pointer=pointer, errors=[{"pointer": pointer, "detail": detail}]
        )
    errors = [
        {"pointer": f"{pointer}/{i}", "detail": v.MSG_NAMESPACE}
        for i, n in enumerate(names)
        if not v.is_valid_namespace(n)
    ]
    if not errors:
        known = set(Namespace.objects.filter(name__in=names).values_list("name", flat=True))
        errors = [
            {"pointer": f"{pointer}/{i}", "detail": MSG_NAMESPACE_MISSING}
            for i, n in enumerate(names)
            if n not in known
        ]
    if errors:
        raise ValidationFailed(errors[0]["detail"], pointer=errors[0]["pointer"], errors=errors)
    return sorted(set(names))


def _wake_after_commit(subscription: Subscription) -> None:
    if not subscription.active:
        return
    subscription_id = str(subscription.id)

    def wake() -> None:
        try:
            pumps.enqueue_pump(subscription_id)
        except Exception:  # noqa: BLE001 - the beat's wake-up sweep delivers it later
            logger.warning("could not wake the pump of subscription %s", subscription_id)

    transaction.on_commit(wake)


@transaction.atomic
def subscription_create(
    *,
    actor: User | None,
    name: str,
    url: str,
    namespaces: Sequence[str] = (),
    capture: str = Capture.NEW_VALUES,
    active: bool = True,
    start: str = "beginning",
) -> Subscription:
    """Create a subscription with a fresh secret; its pump is woken after commit.

    ``start="beginning"`` delivers the whole baseline history first (as a
    pull reader without ``since`` would read it: after an archive cut, from
    the cut); ``start="now"`` begins at the current watermark.
    """
    cursor_seq = feed.watermark()["seq"] if start == "now" else boundary.floor()
    subscription = Subscription.objects.create(
        name=name,
        url=url,
        namespaces=sorted(set(namespaces)),
        capture=capture,
        active=active,
        secret=new_secret(),
        cursor_seq=cursor_seq,
        created_by=actor if getattr(actor, "pk", None) else None,
    )
    _wake_after_commit(subscription)
    return subscription


UPDATABLE = ("name", "url", "namespaces", "capture", "active", "cursor_seq")


@transaction.atomic
def subscription_update(*, subscription_id: Any, changes: dict[str, Any]) -> Subscription:
    """Change some of ``UPDATABLE``; a changed URL, filter, cursor or reactivation
    clears the backoff, so the next delivery is tried at once.

    Takes the row lock, so it waits for a delivery in progress to finish.
    """
    unknown = set(changes) - set(UPDATABLE)
    if unknown:
        raise ValueError(f"not updatable: {sorted(unknown)}")
    subscription = Subscription.objects.select_for_update().filter(pk=subscription_id).first()
    if subscription is None:
        raise NotFound("No such subscription.")
    fields = []
    for name, value in changes.items():
        if name == "namespaces":
            value = sorted(set(value))
        if getattr(subscription, name) != value:
            setattr(subscription, name, value)
            fields.append(name)
    if not fields:
        return subscription
    if set(fields) & {"url", "namespaces", "capture", "active", "cursor_seq"}:
        subscription.consecutive_failures = 0
        subscription.next_attempt_at = None
        fields += ["consecutive_failures", "next_attempt_at"]
    if set(fields) & {"namespaces", "capture", "cursor_seq"}:
        # The records (or the position) changed: a changeset half delivered in
        # parts starts again from its first part, and isolation ends.
        _clear_parts(subscription)
        subscription.narrow_through_seq = 0
        fields += [*PART_FIELDS, "narrow_through_seq"]
    if "cursor_seq" in fields and subscription.parked_seq is not None:
        # Moving the cursor is an operator's decision about where to go on from.
        logger.warning(
            "subscription %s: cursor moved to seq %s while seq %s was parked; unparked",
            subscription.id,
            subscription.cursor_seq,
            subscription.parked_seq,
        )
        _clear_parked(subscription)
        fields += PARKED_FIELDS
    subscription.save(update_fields=[*fields, "updated_at"])
    _wake_after_commit(subscription)
    return subscription


PART_FIELDS = ["part_seq", "part_offset", "parts_done"]
PARKED_FIELDS = ["parked_seq", "parked_part", "parked_error", "parked_attempts", "parked_at"]


def _clear_parts(subscription: Subscription) -> None:
    subscription.part_seq = None
    subscription.part_offset = 0
    subscription.parts_done = 0


def _clear_parked(subscription: Subscription) -> None:
    subscription.parked_seq = None
    subscription.parked_part = None
    subscription.parked_error = ""
    subscription.parked_attempts = 0
    subscription.parked_at = None


def _lock(subscription_id: Any) -> Subscription:
    subscription = Subscription.objects.select_for_update().filter(pk=subscription_id).first()
    if subscription is None:
        raise NotFound("No such subscription.")
    return subscription


def _actor_name(actor: User | None) -> str:
    return getattr(actor, "get_username", lambda: "system")() if actor is not None else "system"


@transaction.atomic
def subscription_rotate_secret(*, subscription_id: Any, actor: User | None) -> Subscription:
    """Give the subscription a new secret; the old one keeps signing for the overlap.

    For ``ATLAS_WEBHOOK_SECRET_OVERLAP_SECONDS`` every delivery carries a
    ``webhook-signature`` from each secret, so a receiver can switch to the
    new one at any moment in that window. Rotating again inside the window
    drops the oldest secret (only the one just replaced keeps signing).
    Takes the row lock, so a delivery in progress finishes with the old pair.
    """
    subscription = _lock(subscription_id)
    now = timezone.now()
    subscription.previous_secret = subscription.secret
    subscription.previous_secret_expires_at = now + timedelta(
        seconds=float(conf.get("ATLAS_WEBHOOK_SECRET_OVERLAP_SECONDS"))
    )
    subscription.secret = new_secret()
    subscription.save(
        update_fields=["secret", "previous_secret", "previous_secret_expires_at", "updated_at"]
    )
    logger.info("subscription %s: secret rotated by %s", subscription.id, _actor_name(actor))
    return subscription


@transaction.atomic
def subscription_retry(*, subscription_id: Any, actor: User | None) -> Subscription:
    """Unpark: deliver the parked changeset (or part) again, at once, with a fresh
    round of ``ATLAS_WEBHOOK_MAX_ATTEMPTS`` attempts. 409 when nothing is parked."""
    subscription = _lock(subscription_id)
    if subscription.parked_seq is None:
        raise Conflict(MSG_NOTHING_PARKED)
    logger.warning(
        "subscription %s: parked seq %s retried by %s",
        subscription.id,
        subscription.parked_seq,
        _actor_name(actor),
    )
    _clear_parked(subscription)
    subscription.consecutive_failures = 0
    subscription.next_attempt_at = None
    subscription.save(
        update_fields=[*PARKED_FIELDS, "consecutive_failures", "next_attempt_at", "updated_at"]
    )
    _wake_after_commit(subscription)
    return subscription


@transaction.atomic
def subscription_skip(*, subscription_id: Any, actor: User | None) -> Subscription:
    """Give up on the parked changeset: move the cursor past it (all its parts).

    The receiver never gets it from the push side (it stays readable at
    ``GET /changes``); ``last_error`` and a warning log line record who skipped
    which seq and why it had parked. 409 when nothing is parked.
    """
    subscription = _lock(subscription_id)
    seq = subscription.parked_seq
    if seq is None:
        raise Conflict(MSG_NOTHING_PARKED)
    who = _actor_name(actor)
    part = f" part {subscription.parked_part}" if subscription.parked_part else ""
    note = (
        f"{rfc3339(timezone.now())} skipped seq {seq}{part} by {who} after "
        f"{subscription.parked_attempts} attempt(s): {subscription.parked_error}"
    )
    logger.warning("subscription %s: %s", subscription.id, note)
    subscription.cursor_seq = max(subscription.cursor_seq, seq)
    subscription.last_error = note[:2000]
    subscription.consecutive_failures = 0
    subscription.next_attempt_at = None
    _clear_parked(subscription)
    _clear_parts(subscription)  # isolation (narrow_through_seq) goes on past it
    subscription.save(
        update_fields=[
            "cursor_seq",
            "last_error",
            "consecutive_failures",
            "next_attempt_at",
            *PARKED_FIELDS,
            *PART_FIELDS,
            "updated_at",
        ]
    )
    _wake_after_commit(subscription)
    return subscription


@transaction.atomic
def subscription_delete(*, subscription_id: Any) -> None:
    """Delete the subscription (waits for a delivery in progress to finish)."""
    subscription = Subscription.objects.select_for_update().filter(pk=subscription_id).first()
    if subscription is None:
        raise NotFound("No such subscription.")
    subscription.delete()


# --- reads -------------------------------------------------------------------------------


def subscription_list(*, after_id: Any = None) -> QuerySet[Subscription]:
    """All subscriptions, oldest first (ids are UUIDv7, so id order is creation order)."""
    qs = Subscription.objects.order_by("id")
    if after_id is not None:
        qs = qs.filter(id__gt=after_id)
    return qs


def subscription_get(*, subscription_id: Any) -> Subscription | None:
    return Subscription.objects.filter(pk=subscription_id).first()


def subscription_lag(subscription: Subscription) -> int:
    """Baseline changesets in the subscription's namespaces after its cursor."""
    return feed.changesets_after(
        after_seq=subscription.cursor_seq, namespaces=subscription.namespaces or None
    )
