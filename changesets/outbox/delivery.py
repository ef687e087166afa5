"""One webhook delivery: claim a subscription, send its next page, record the outcome.

:func:`deliver_next_page` is one step of a pump run (the run, and its
scheduling, is :mod:`changesets.outbox.pumps`):

1. Claim the subscription row with ``SELECT … FOR UPDATE SKIP LOCKED``. A
   row another worker holds means a delivery is in progress there: this run
   leaves ("busy"), so two workers never deliver one subscription at once and
   pages go out in seq order. A parked subscription is left alone ("parked").
2. Read the next feed page after the durable cursor (the subscription's
   namespaces and capture mode) and choose what this delivery holds
   (:func:`changesets.outbox.payloads.plan_delivery`): whole changesets within
   ``ATLAS_WEBHOOK_PAGE_SIZE`` records and ``ATLAS_WEBHOOK_MAX_BODY_BYTES``
   bytes, or the next part of a changeset too big for one delivery.
3. POST it, signed (Standard Webhooks, plus the deprecated
   ``X-Atlas-Signature``), holding the row lock. A 2xx advances the cursor
   (after a changeset's last part only) in the same transaction; anything
   else (status, timeout, refused connection) records the error and sets the
   next attempt time (exponential backoff with jitter), and the step says
   when to retry. After ``ATLAS_WEBHOOK_MAX_ATTEMPTS`` failures the delivery
   parks (one changeset), or narrows first (several).
4. Commit, releasing the lock.

A worker killed between the POST and the commit leaves the cursor where it
was, so that page is delivered again (at-least-once). Receivers de-duplicate
by ``event_id`` (or by the ``X-Atlas-Delivery`` id, stable for the same page).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from atlas import conf
from atlas.api.render import rfc3339
from changesets.exceptions import Archived
from changesets.models import Subscription
from changesets.outbox import metrics, webhooks
from changesets.outbox.payloads import Outgoing, plan_delivery
from changesets.selectors import feed

logger = logging.getLogger(__name__)

MAX_ERROR_LENGTH = 2000


def backoff_seconds(failures: int) -> float:
    """Delay before the next attempt after ``failures`` consecutive failures.

    Exponential (base × 2^(failures−1), capped), with "equal jitter": a random
    point in the upper half, so retries of many subscriptions spread out but
    never come sooner than half the nominal delay.
    """
    base = float(conf.get("ATLAS_WEBHOOK_BACKOFF_BASE_SECONDS"))
    cap = float(conf.get("ATLAS_WEBHOOK_BACKOFF_MAX_SECONDS"))
    delay = min(cap, base * (2 ** max(failures - 1, 0)))
    return delay / 2 + random.uniform(0, delay / 2)


# --- one step of the pump ----------------------------------------------------------------


@dataclass
class StepResult:
    outcome: (
        str  # delivered | failed | narrowed | parked | idle | busy | missing | inactive | backoff
    )
    retry_in: float | None = None
    # More was ready at once: the page was full, or this delivery was one part
    # of a changeset or stopped short of the page at the body limit.
    full: bool = False


def deliver_next_page(subscription_id: str) -> StepResult:
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
        try:
            with metrics.feed_page_timer("push"):
                page = feed.feed_page(
                    after_seq=subscription.cursor_seq,
                    namespaces=subscription.namespaces or None,
                    capture=subscription.capture,
                    limit=conf.get("ATLAS_WEBHOOK_PAGE_SIZE"),
                    from_cut=True,  # made or moved to the cut (the planner never cuts at it)
                )
        except Archived as exc:
            _park_archived(subscription, exc, at=now)
            return StepResult("parked")
        if not page.records:
            return StepResult("idle")
        out = plan_delivery(subscription, page)
        if out.oversize:
            _park(subscription, out, error=out.oversize, attempts=0, at=now)
            return StepResult("parked")
        headers = {
            "Content-Type": "application/json",
            "User-Agent": webhooks.USER_AGENT,
            **webhooks.signature_headers(subscription, out.delivery, out.body, now=timezone.now()),
        }
        outcome = webhooks.post_json(
            subscription.url, out.body, headers, timeout=conf.get("ATLAS_WEBHOOK_TIMEOUT_SECONDS")
        )
        finished = timezone.now()
        if outcome.ok:
            _record_success(subscription, out, at=finished)
            more = page.full or not out.last_part or out.cursor_after < page.last_seq
            return StepResult("delivered", full=more)
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
    if failures >= int(conf.get("ATLAS_WEBHOOK_MAX_ATTEMPTS")):
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


def _park_archived(subscription: Subscription, exc: Archived, *, at: datetime) -> None:
    """Park a subscription whose cursor lies before an archive cut (it was inactive while
    the cut was made): what it is owed is in the archive. ``skip`` moves it to the cut."""
    error = (
        f"the changesets after seq {subscription.cursor_seq} through {exc.seq} are archived"
        f" (checkpoint {exc.checkpoint}); skip moves the cursor to the cut"
    )
    Subscription.objects.filter(pk=subscription.pk).update(
        parked_seq=exc.seq,
        parked_part=None,
        parked_error=error,
        parked_attempts=0,
        parked_at=at,
        last_error=f"{rfc3339(at)} {error}"[:MAX_ERROR_LENGTH],
        next_attempt_at=None,
    )
    logger.warning("subscription %s parked: %s", subscription.id, error)


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
