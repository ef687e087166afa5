"""The push pump: deliver a subscription's feed pages to its URL, in order.

One pump run (:func:`subscription_pump`) repeats, page by page:

1. Claim the subscription row with ``SELECT … FOR UPDATE SKIP LOCKED``. A
   row another worker holds means a delivery is in progress there: this run
   leaves ("busy"), so two workers never deliver one subscription at once and
   pages go out in seq order.
2. Read the next feed page after the durable cursor (the subscription's
   namespaces and capture mode).
3. POST it, signed, holding the row lock. A 2xx advances the cursor in the
   same transaction; anything else (status, timeout, refused connection)
   records the error and sets the next attempt time (exponential backoff
   with jitter), and a retry is scheduled.
4. Commit, releasing the lock; go on while there are pages.

A worker killed between the POST and the commit leaves the cursor where it
was, so that page is delivered again (at-least-once). Receivers de-duplicate
by ``event_id`` (or by the ``X-Atlas-Delivery`` id, stable for the same page).

Lost wake-ups: a wake that arrives while a run holds the row finds it busy
and leaves. So after a run finds nothing to deliver and releases the row, it
looks once more; anything committed in between is picked up by this run.
The beat task :func:`wake_due_subscriptions` is the safety net for pumps
whose messages were lost (a worker killed, the broker restarted).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
import random
import socket
import ssl
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from atlas.api.render import rfc3339
from changesets import feed
from changesets.models import Subscription
from changesets.subscriptions import UnsafeAddress, resolve_webhook_host

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Atlas-Signature"
DELIVERY_HEADER = "X-Atlas-Delivery"
USER_AGENT = "Atlas-Webhook/1"
_DELIVERY_NAMESPACE = uuid.UUID("5f0c8a8e-6a53-4c3e-9b1e-2f7b8f0e7a11")
MAX_ERROR_LENGTH = 2000


def sign(secret: str, body: bytes) -> str:
    """The ``X-Atlas-Signature`` value: ``sha256=<hex HMAC-SHA256 of the body>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff_seconds(failures: int) -> float:
    """Delay before the next attempt after ``failures`` consecutive failures.

    Exponential (base × 2^(failures−1), capped), with "equal jitter": a random
    point in the upper half, so retries of many subscriptions spread out but
    never come sooner than half the nominal delay.
    """
    base = float(settings.ATLAS_WEBHOOK_BACKOFF_BASE_SECONDS)
    cap = float(settings.ATLAS_WEBHOOK_BACKOFF_MAX_SECONDS)
    delay = min(cap, base * (2 ** max(failures - 1, 0)))
    return delay / 2 + random.uniform(0, delay / 2)


@dataclass
class HttpOutcome:
    status: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def post_json(url: str, body: bytes, headers: dict[str, str], *, timeout: float) -> HttpOutcome:
    """POST ``body`` to ``url``; never raises for network trouble.

    The host is resolved and vetted once (:func:`resolve_webhook_host`) and the
    connection goes to that vetted address, so a DNS answer that changes
    between the check and the connect cannot redirect a delivery to a private
    address. Redirects are not followed (a 3xx is a failure), proxies from the
    environment are not used, and ``timeout`` bounds the connect and each read.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = resolve_webhook_host(host, port)
    except UnsafeAddress as exc:
        return HttpOutcome(None, f"refused: {host} resolves to non-public address {exc}")
    except (OSError, UnicodeError) as exc:
        return HttpOutcome(None, f"cannot resolve {host}: {exc}")

    def connect(_address: Any, conn_timeout: Any = None, source_address: Any = None) -> Any:
        error: OSError | None = None
        for address in addresses:  # each vetted address in turn, as create_connection would
            try:
                return socket.create_connection((address, port), conn_timeout, source_address)
            except OSError as exc:
                error = exc
        raise error or OSError(f"no address for {host}")

    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn._create_connection = connect  # type: ignore[attr-defined]  # pin the vetted address
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        excerpt = response.read(512).decode("utf-8", "replace")
        if 200 <= response.status < 300:
            return HttpOutcome(response.status)
        return HttpOutcome(response.status, f"HTTP {response.status}: {excerpt}".strip())
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        return HttpOutcome(None, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def delivery_id(subscription: Subscription, page: feed.FeedPage) -> str:
    """Stable for the same page of the same subscription: a redelivery keeps its id."""
    scope = f"{subscription.id}:{page.after_seq}:{page.last_seq}:{page.capture}:"
    scope += ",".join(subscription.namespaces)
    return str(uuid.uuid5(_DELIVERY_NAMESPACE, scope))


def page_body(subscription: Subscription, page: feed.FeedPage, delivery: str) -> bytes:
    """The delivered document: a feed page, plus which subscription and delivery it is."""
    document = {"subscription_id": str(subscription.id), "delivery_id": delivery}
    document.update(page.as_dict())
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class StepResult:
    outcome: str  # delivered | failed | idle | busy | missing | inactive | backoff
    retry_in: float | None = None
    full: bool = False


def _deliver_next_page(subscription_id: str) -> StepResult:
    """Claim the subscription, deliver its next page, record the outcome (one transaction)."""
    with transaction.atomic():
        subscription = (
            Subscription.objects.select_for_update(skip_locked=True)
            .filter(pk=subscription_id)
            .first()
        )
        if subscription is None:
            exists = Subscription.objects.filter(pk=subscription_id).exists()
            return StepResult("busy" if exists else "missing")
        if not subscription.active:
            return StepResult("inactive")
        now = timezone.now()
        if subscription.next_attempt_at is not None and subscription.next_attempt_at > now:
            return StepResult("backoff")
        page = feed.feed_page(
            after_seq=subscription.cursor_seq,
            namespaces=subscription.namespaces or None,
            capture=subscription.capture,
            limit=settings.ATLAS_WEBHOOK_PAGE_SIZE,
            surface="push",
        )
        if not page.records:
            return StepResult("idle")
        delivery = delivery_id(subscription, page)
        body = page_body(subscription, page, delivery)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            SIGNATURE_HEADER: sign(subscription.secret, body),
            DELIVERY_HEADER: delivery,
        }
        outcome = post_json(
            subscription.url, body, headers, timeout=settings.ATLAS_WEBHOOK_TIMEOUT_SECONDS
        )
        finished = timezone.now()
        if outcome.ok:
            Subscription.objects.filter(pk=subscription.pk).update(
                cursor_seq=page.last_seq,
                last_delivery_at=finished,
                last_error="",
                consecutive_failures=0,
                next_attempt_at=None,
                deliveries_ok=F("deliveries_ok") + 1,
            )
            return StepResult("delivered", full=page.full)
        failures = subscription.consecutive_failures + 1
        delay = backoff_seconds(failures)
        error = outcome.error or "delivery failed"
        Subscription.objects.filter(pk=subscription.pk).update(
            last_error=f"{rfc3339(finished)} {error}"[:MAX_ERROR_LENGTH],
            consecutive_failures=failures,
            next_attempt_at=finished + timedelta(seconds=delay),
            deliveries_failed=F("deliveries_failed") + 1,
        )
        logger.info(
            "delivery %s to subscription %s failed (%s); retry in %.1fs",
            delivery,
            subscription.id,
            error,
            delay,
        )
        return StepResult("failed", retry_in=delay)


def subscription_pump(
    *,
    subscription_id: str,
    max_pages: int | None = None,
    max_seconds: float | None = None,
) -> str:
    """Deliver pages to one subscription until it is caught up, fails, or has had its turn.

    Returns what stopped it: ``idle`` (caught up), ``failed`` (a retry is
    scheduled after the backoff), ``yielded`` (had its turn; a new run is
    queued so other subscriptions' pumps get workers too), or ``busy``,
    ``backoff``, ``inactive``, ``missing``.
    """
    max_pages = max_pages or settings.ATLAS_WEBHOOK_MAX_PAGES_PER_RUN
    deadline = time.monotonic() + (max_seconds or settings.ATLAS_WEBHOOK_MAX_SECONDS_PER_RUN)
    pages = 0
    while True:
        step = _deliver_next_page(subscription_id)
        if step.outcome == "delivered":
            pages += 1
            if pages >= max_pages or time.monotonic() >= deadline:
                enqueue_pump(subscription_id)
                return "yielded"
            continue
        if step.outcome == "idle":
            # The row is released now. A wake that came while we held it was
            # turned away as "busy": look again so its changeset is not left
            # waiting for the beat.
            subscription = Subscription.objects.filter(pk=subscription_id).first()
            if subscription is not None and feed.has_records_after(
                after_seq=subscription.cursor_seq, namespaces=subscription.namespaces or None
            ):
                continue
            return "idle"
        if step.outcome == "failed" and step.retry_in is not None:
            enqueue_pump(subscription_id, countdown=step.retry_in)
        return step.outcome


def enqueue_pump(subscription_id: str, *, countdown: float | None = None) -> None:
    """Queue a pump run for one subscription (raises when the broker is unreachable)."""
    from changesets.tasks import subscription_pump as task

    if countdown:
        task.apply_async(args=[str(subscription_id)], countdown=countdown)
    else:
        task.delay(str(subscription_id))


def _due(now: Any) -> Q:
    return Q(active=True) & (Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))


def subscriptions_for(namespaces: Sequence[str]) -> list[str]:
    """Ids of due, active subscriptions that a changeset in ``namespaces`` concerns."""
    return [
        str(pk)
        for pk in Subscription.objects.filter(_due(timezone.now()))
        .filter(Q(namespaces=[]) | Q(namespaces__overlap=list(namespaces)))
        .values_list("pk", flat=True)
    ]


def wake_pumps(*, namespaces: Sequence[str]) -> int:
    """Queue a pump for every due subscription a changeset in ``namespaces`` concerns.

    Subscriptions in backoff are skipped: their retry is already scheduled.
    Raises when the broker is unreachable (the journal entry then stays
    outstanding and is retried).
    """
    ids = subscriptions_for(namespaces)
    for subscription_id in ids:
        enqueue_pump(subscription_id)
    return len(ids)


def wake_due_subscriptions() -> int:
    """Queue a pump for every due, active subscription with something to deliver.

    The beat safety net: covers pump messages lost to a killed worker or a
    restarted broker, and retries whose scheduled message went missing.
    """
    woken = 0
    for subscription in Subscription.objects.filter(_due(timezone.now())).only(
        "id", "cursor_seq", "namespaces"
    ):
        if feed.has_records_after(
            after_seq=subscription.cursor_seq, namespaces=subscription.namespaces or None
        ):
            enqueue_pump(str(subscription.id))
            woken += 1
    return woken
