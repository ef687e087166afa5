"""Subscriptions: push consumers of the change feed (services and reads).

A subscription is a server-side reader of the feed with a durable cursor;
:mod:`changesets.delivery` pumps it. These services only create, change and
delete the rows, and wake the pump after commit when there may be something
new to deliver.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet

from atlas.exceptions import NotFound, ValidationFailed
from changesets import feed
from changesets.models import Capture, Subscription
from entities import validation as v
from entities.models import Namespace

logger = logging.getLogger(__name__)

MAX_URL_LENGTH = 2000
MAX_NAME_LENGTH = 200
SECRET_BYTES = 32

MSG_URL_SCHEME = "Must be an http:// or https:// URL with a host."
MSG_URL_PRIVATE = (
    "Resolves to a loopback, private or otherwise non-public address; "
    "refused unless ATLAS_ALLOW_PRIVATE_WEBHOOKS is on."
)
MSG_URL_UNRESOLVABLE = "The host name does not resolve."
MSG_NAMESPACE_MISSING = "No such namespace."


class UnsafeAddress(Exception):
    """A webhook host resolved to an address deliveries may not go to."""


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def resolve_webhook_host(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to, vetted against the private-address rule.

    Raises :class:`UnsafeAddress` when any of them is loopback, private,
    link-local or otherwise non-public and private webhooks are not allowed,
    and ``OSError`` when the name does not resolve.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS:
        for address in addresses:
            if not _public(ipaddress.ip_address(address.split("%", 1)[0])):
                raise UnsafeAddress(address)
    return addresses


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
        from changesets.delivery import enqueue_pump

        try:
            enqueue_pump(subscription_id)
        except Exception:  # noqa: BLE001 - the beat's wake-up sweep delivers it later
            logger.warning("could not wake the pump of subscription %s", subscription_id)

    transaction.on_commit(wake)


@transaction.atomic
def subscription_create(
    *,
    actor: AbstractBaseUser | None,
    name: str,
    url: str,
    namespaces: Sequence[str] = (),
    capture: str = Capture.NEW_VALUES,
    active: bool = True,
    start: str = "beginning",
) -> Subscription:
    """Create a subscription with a fresh secret; its pump is woken after commit.

    ``start="beginning"`` delivers the whole baseline history first (as a
    pull reader without ``since`` would read it); ``start="now"`` begins at
    the current watermark.
    """
    cursor_seq = feed.watermark()["seq"] if start == "now" else 0
    subscription = Subscription.objects.create(
        name=name,
        url=url,
        namespaces=sorted(set(namespaces)),
        capture=capture,
        active=active,
        secret=secrets.token_hex(SECRET_BYTES),
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
    subscription.save(update_fields=[*fields, "updated_at"])
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
