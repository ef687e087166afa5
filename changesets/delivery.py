"""The push pump: deliver a subscription's feed pages to its URL, in order.

One pump run (:func:`subscription_pump`) repeats, page by page:

1. Claim the subscription row with ``SELECT … FOR UPDATE SKIP LOCKED``. A
   row another worker holds means a delivery is in progress there: this run
   leaves ("busy"), so two workers never deliver one subscription at once and
   pages go out in seq order. A parked subscription is left alone ("parked").
2. Read the next feed page after the durable cursor (the subscription's
   namespaces and capture mode) and choose what this delivery holds
   (:func:`plan_delivery`): whole changesets within
   ``ATLAS_WEBHOOK_PAGE_SIZE`` records and ``ATLAS_WEBHOOK_MAX_BODY_BYTES``
   bytes, or the next part of a changeset too big for one delivery.
3. POST it, signed (Standard Webhooks, plus the deprecated
   ``X-Atlas-Signature``), holding the row lock. A 2xx advances the cursor
   (after a changeset's last part only) in the same transaction; anything
   else (status, timeout, refused connection) records the error and sets the
   next attempt time (exponential backoff with jitter), and a retry is
   scheduled. After ``ATLAS_WEBHOOK_MAX_ATTEMPTS`` failures the delivery
   parks (one changeset), or narrows first (several).
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
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from standardwebhooks import Webhook

from atlas.api.render import rfc3339
from changesets import feed
from changesets.models import Subscription
from changesets.subscriptions import SECRET_PREFIX, UnsafeAddress, resolve_webhook_host

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Atlas-Signature"  # deprecated: kept beside the Standard Webhooks headers
DELIVERY_HEADER = "X-Atlas-Delivery"
WEBHOOK_ID_HEADER = "webhook-id"
WEBHOOK_TIMESTAMP_HEADER = "webhook-timestamp"
WEBHOOK_SIGNATURE_HEADER = "webhook-signature"
USER_AGENT = "Atlas-Webhook/1"
_DELIVERY_NAMESPACE = uuid.UUID("5f0c8a8e-6a53-4c3e-9b1e-2f7b8f0e7a11")
MAX_ERROR_LENGTH = 2000


def sign(secret: str, body: bytes) -> str:
    """The deprecated ``X-Atlas-Signature`` value: ``sha256=<hex HMAC-SHA256 of the body>``,
    keyed by the secret string's own bytes (``whsec_`` prefix included)."""
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


def part_delivery_id(
    subscription: Subscription, *, seq: int, offset: int, part: int, parts: int, capture: str
) -> str:
    """Stable for the same part of the same changeset: each part has its own id."""
    scope = f"{subscription.id}:part:{seq}:{offset}:{part}/{parts}:{capture}:"
    scope += ",".join(subscription.namespaces)
    return str(uuid.uuid5(_DELIVERY_NAMESPACE, scope))


def _encode(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def page_body(
    subscription: Subscription,
    page: feed.FeedPage,
    delivery: str,
    *,
    part: int | None = None,
    parts: int | None = None,
) -> bytes:
    """The delivered document: a feed page, plus which subscription and delivery it is
    (and, for a changeset delivered in parts, which ``part`` of how many ``parts``)."""
    document = {"subscription_id": str(subscription.id), "delivery_id": delivery}
    document.update(page.as_dict())
    if part is not None:
        document["part"] = part
        document["parts"] = parts
    return _encode(document)


# --- signing -----------------------------------------------------------------------------


def _webhook(secret: str) -> Webhook:
    """The Standard Webhooks signer for a stored secret.

    ``whsec_<base64>`` secrets (issued since Standard Webhooks signing) key the
    HMAC with the base64-decoded bytes, as the spec says. Older secrets (64 hex
    characters, no prefix) key it with their own ASCII bytes, the same key
    ``X-Atlas-Signature`` always used, so existing receivers need no new secret.
    """
    if secret.startswith(SECRET_PREFIX):
        return Webhook(secret)
    return Webhook(secret.encode())


def signing_secrets(subscription: Subscription, *, now: datetime) -> list[str]:
    """The secrets a delivery at ``now`` is signed with: the current one, and the
    previous one while its rotation overlap lasts."""
    found = [subscription.secret]
    expires = subscription.previous_secret_expires_at
    if subscription.previous_secret and expires is not None and expires > now:
        found.append(subscription.previous_secret)
    return found


def signature_headers(
    subscription: Subscription, delivery: str, body: bytes, *, now: datetime
) -> dict[str, str]:
    """Standard Webhooks headers (one ``v1,`` signature per live secret, space-separated)
    and the deprecated ``X-Atlas-Signature`` (current secret only)."""
    timestamp = datetime.fromtimestamp(int(now.timestamp()), tz=UTC)
    text = body.decode()
    signatures = [
        _webhook(secret).sign(msg_id=delivery, timestamp=timestamp, data=text)
        for secret in signing_secrets(subscription, now=now)
    ]
    return {
        WEBHOOK_ID_HEADER: delivery,
        WEBHOOK_TIMESTAMP_HEADER: str(int(timestamp.timestamp())),
        WEBHOOK_SIGNATURE_HEADER: " ".join(signatures),
        SIGNATURE_HEADER: sign(subscription.secret, body),
        DELIVERY_HEADER: delivery,
    }


# --- what one delivery holds -------------------------------------------------------------


@dataclass
class Outgoing:
    """One delivery: whole changesets, or one part of one changeset.

    ``seq`` is its first changeset (the one a parked delivery names);
    ``cursor_after`` is where a 2xx moves the cursor (unchanged for a part
    that is not the last). ``oversize`` says why it cannot be sent at all.
    """

    seq: int
    cursor_after: int
    records: int
    changesets: int
    delivery: str = ""
    body: bytes = b""
    part: int | None = None
    parts: int | None = None
    offset: int = 0
    oversize: str = ""

    @property
    def last_part(self) -> bool:
        return self.part is None or self.part == self.parts


@dataclass
class _Changeset:
    seq: int
    records: list[dict[str, Any]]
    sizes: list[int]


def _changesets(page: feed.FeedPage) -> list[_Changeset]:
    groups: list[_Changeset] = []
    for record in page.records:
        if not groups or groups[-1].seq != record["seq"]:
            groups.append(_Changeset(record["seq"], [], []))
        groups[-1].records.append(record)
        groups[-1].sizes.append(len(_encode(record)))
    return groups


def _body_size(overhead: int, sizes: Sequence[int]) -> int:
    # The document with an empty record list, plus the records and the commas between them.
    return overhead + sum(sizes) + max(len(sizes) - 1, 0)


def _envelope_size(subscription: Subscription, page: feed.FeedPage, **part: int) -> int:
    return len(page_body(subscription, page, str(uuid.UUID(int=0)), **part))


def _subpage(
    page: feed.FeedPage, records: list[dict[str, Any]], cursor_after: int
) -> feed.FeedPage:
    return feed.FeedPage(
        records=records,
        after_seq=page.after_seq,
        last_seq=cursor_after,
        capture=page.capture,
        watermark=page.watermark,
    )


def plan_delivery(subscription: Subscription, page: feed.FeedPage) -> Outgoing:
    """Choose what the next delivery holds, within the record and byte bounds.

    1. A changeset already half delivered in parts (``part_seq`` is the next
       changeset): its next part.
    2. Otherwise as many whole changesets from the page as fit in
       ``ATLAS_WEBHOOK_PAGE_SIZE`` records and ``ATLAS_WEBHOOK_MAX_BODY_BYTES``
       bytes (only one while the subscription is isolating a failure).
    3. If not even the first fits, it goes in parts: step 1 from its first record.
    """
    groups = _changesets(page)
    first = groups[0]
    if subscription.part_seq == first.seq and subscription.part_offset < len(first.records):
        return _plan_part(
            subscription, page, first, offset=subscription.part_offset, done=subscription.parts_done
        )
    max_records = int(settings.ATLAS_WEBHOOK_PAGE_SIZE)
    max_bytes = int(settings.ATLAS_WEBHOOK_MAX_BODY_BYTES)
    room = 1 if subscription.cursor_seq < subscription.narrow_through_seq else len(groups)
    records: list[dict[str, Any]] = []
    sizes: list[int] = []
    taken = 0
    for group in groups[:room]:
        candidate = sizes + group.sizes
        overhead = _envelope_size(subscription, _subpage(page, [], group.seq))
        if len(candidate) > max_records or _body_size(overhead, candidate) > max_bytes:
            break
        records += group.records
        sizes = candidate
        taken += 1
    if not taken:
        return _plan_part(subscription, page, first, offset=0, done=0)
    cursor_after = groups[taken - 1].seq
    subpage = _subpage(page, records, cursor_after)
    delivery = delivery_id(subscription, subpage)
    return Outgoing(
        seq=first.seq,
        cursor_after=cursor_after,
        records=len(records),
        changesets=taken,
        delivery=delivery,
        body=page_body(subscription, subpage, delivery),
    )


def _split(sizes: Sequence[int], *, overhead: int) -> list[tuple[int, int]]:
    """Greedy ``(start, end)`` runs of records, each within both bounds.

    Greedy from a given record is the tail of greedy from any earlier part
    boundary, so re-splitting what is left after a delivered part gives the
    same remaining parts (as long as the records did not change).
    A record that alone exceeds the byte bound is a run of its own.
    """
    max_records = int(settings.ATLAS_WEBHOOK_PAGE_SIZE)
    max_bytes = int(settings.ATLAS_WEBHOOK_MAX_BODY_BYTES)
    runs: list[tuple[int, int]] = []
    start = 0
    while start < len(sizes):
        end, total = start + 1, overhead + sizes[start]
        while (
            end < len(sizes)
            and end - start < max_records
            and total + 1 + sizes[end] <= max_bytes  # 1: the comma before it
        ):
            total += 1 + sizes[end]
            end += 1
        runs.append((start, end))
        start = end
    return runs


def _plan_part(
    subscription: Subscription, page: feed.FeedPage, group: _Changeset, *, offset: int, done: int
) -> Outgoing:
    # An upper bound of the envelope: the final cursor is the longest, and part
    # numbers never reach 10 digits.
    overhead = _envelope_size(subscription, _subpage(page, [], group.seq), part=10**9, parts=10**9)
    runs = _split(group.sizes[offset:], overhead=overhead)
    part, parts = done + 1, done + len(runs)
    start, end = runs[0]
    records = group.records[offset + start : offset + end]
    cursor_after = group.seq if part == parts else page.after_seq
    out = Outgoing(
        seq=group.seq,
        cursor_after=cursor_after,
        records=len(records),
        changesets=1,
        part=part,
        parts=parts,
        offset=offset,
    )
    size = _body_size(overhead, group.sizes[offset + start : offset + end])
    if size > int(settings.ATLAS_WEBHOOK_MAX_BODY_BYTES):
        record = records[0]
        out.oversize = (
            f"record {record['event_id']} alone makes a {size}-byte delivery, over "
            f"ATLAS_WEBHOOK_MAX_BODY_BYTES ({settings.ATLAS_WEBHOOK_MAX_BODY_BYTES}); "
            "raise the limit and retry, or skip it"
        )
        return out
    out.delivery = part_delivery_id(
        subscription, seq=group.seq, offset=offset, part=part, parts=parts, capture=page.capture
    )
    subpage = _subpage(page, records, cursor_after)
    out.body = page_body(subscription, subpage, out.delivery, part=part, parts=parts)
    return out


# --- one step of the pump ----------------------------------------------------------------


@dataclass
class StepResult:
    outcome: (
        str  # delivered | failed | narrowed | parked | idle | busy | missing | inactive | backoff
    )
    retry_in: float | None = None
    full: bool = False


def _deliver_next_page(subscription_id: str) -> StepResult:
    """Claim the subscription, deliver its next page or part, record the outcome.

    One transaction, holding the row lock across the POST."""
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
        if subscription.parked_seq is not None:
            return StepResult("parked")
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
        out = plan_delivery(subscription, page)
        if out.oversize:
            _park(subscription, out, error=out.oversize, attempts=0, at=now)
            return StepResult("parked")
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            **signature_headers(subscription, out.delivery, out.body, now=timezone.now()),
        }
        outcome = post_json(
            subscription.url, out.body, headers, timeout=settings.ATLAS_WEBHOOK_TIMEOUT_SECONDS
        )
        finished = timezone.now()
        if outcome.ok:
            _record_success(subscription, out, at=finished)
            return StepResult("delivered", full=page.full)
        return _record_failure(
            subscription, out, error=outcome.error or "delivery failed", at=finished
        )


def _record_success(subscription: Subscription, out: Outgoing, *, at: datetime) -> None:
    changes: dict[str, Any] = {
        "last_delivery_at": at,
        "last_error": "",
        "consecutive_failures": 0,
        "next_attempt_at": None,
        "deliveries_ok": F("deliveries_ok") + 1,
    }
    if out.last_part:
        changes.update(cursor_seq=out.cursor_after, part_seq=None, part_offset=0, parts_done=0)
        if out.cursor_after >= subscription.narrow_through_seq:
            changes["narrow_through_seq"] = 0
    else:
        changes.update(part_seq=out.seq, part_offset=out.offset + out.records, parts_done=out.part)
    Subscription.objects.filter(pk=subscription.pk).update(**changes)


def _record_failure(
    subscription: Subscription, out: Outgoing, *, error: str, at: datetime
) -> StepResult:
    """Back off; after ``ATLAS_WEBHOOK_MAX_ATTEMPTS`` failures, narrow or park.

    A delivery of several changesets that keeps failing is not parked: the
    subscription narrows to one changeset per delivery up to that delivery's
    end, retried at once, so the delivery that finally parks is exactly one
    changeset (or one part of one) and skipping it drops nothing else.
    """
    failures = subscription.consecutive_failures + 1
    stamped = f"{rfc3339(at)} {error}"[:MAX_ERROR_LENGTH]
    if failures >= int(settings.ATLAS_WEBHOOK_MAX_ATTEMPTS):
        if out.changesets > 1:
            Subscription.objects.filter(pk=subscription.pk).update(
                last_error=stamped,
                consecutive_failures=0,
                next_attempt_at=None,
                narrow_through_seq=out.cursor_after,
                deliveries_failed=F("deliveries_failed") + 1,
            )
            logger.warning(
                "delivery %s to subscription %s failed %d times (%s); retrying its"
                " changesets one by one",
                out.delivery,
                subscription.id,
                failures,
                error,
            )
            return StepResult("narrowed")
        _park(subscription, out, error=error, attempts=failures, at=at)
        return StepResult("parked")
    delay = backoff_seconds(failures)
    Subscription.objects.filter(pk=subscription.pk).update(
        last_error=stamped,
        consecutive_failures=failures,
        next_attempt_at=at + timedelta(seconds=delay),
        deliveries_failed=F("deliveries_failed") + 1,
    )
    logger.info(
        "delivery %s to subscription %s failed (%s); retry in %.1fs",
        out.delivery,
        subscription.id,
        error,
        delay,
    )
    return StepResult("failed", retry_in=delay)


def _park(
    subscription: Subscription, out: Outgoing, *, error: str, attempts: int, at: datetime
) -> None:
    """Dead-letter the delivery: no more attempts until an operator retries or skips it."""
    stamped = f"{rfc3339(at)} {error}"[:MAX_ERROR_LENGTH]
    Subscription.objects.filter(pk=subscription.pk).update(
        parked_seq=out.seq,
        parked_part=out.part,
        parked_error=error[:MAX_ERROR_LENGTH],
        parked_attempts=attempts,
        parked_at=at,
        last_error=stamped,
        consecutive_failures=attempts,
        next_attempt_at=None,
        deliveries_failed=F("deliveries_failed") + (1 if attempts else 0),
    )
    part = f" part {out.part}/{out.parts}" if out.part else ""
    logger.warning(
        "subscription %s parked at seq %s%s after %d attempt(s): %s",
        subscription.id,
        out.seq,
        part,
        attempts,
        error,
    )


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
        if step.outcome == "narrowed":
            continue  # its first changeset alone, at once
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
    return Q(active=True, parked_seq__isnull=True) & (
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
    )


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
