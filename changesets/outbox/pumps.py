"""Subscription pumps: a run of deliveries, its Celery tasks, and the one way to queue one.

A pump run (:func:`subscription_pump`) repeats :func:`delivery.deliver_next_page`
until the subscription is caught up, a delivery fails (a retry is queued after
the backoff), or the run has had its turn (a new run is queued, so other
subscriptions' pumps get workers too).

Queueing a pump (:func:`enqueue_pump`) lives here, with the pump's tasks,
because three places need it: the journal wakes the pumps a committed
changeset concerns, the subscription services wake a pump after a change,
and a run queues its own continuation. They import this module; it imports
neither of them, so there is no cycle, and ``changesets.tasks`` (the
journal's tasks) sits above the journal.

Lost wake-ups: a wake that arrives while a run holds the row finds it busy
and leaves. So after a run finds nothing to deliver and releases the row, it
looks once more; anything committed in between is picked up by this run.
The beat task :func:`subscriptions_wake` is the safety net for pumps whose
messages were lost (a worker killed, the broker restarted).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from celery import shared_task
from django.db import connection, transaction

from atlas import conf
from changesets.models import Subscription
from changesets.outbox import delivery
from changesets.selectors import feed


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
    max_pages = max_pages or conf.get("ATLAS_WEBHOOK_MAX_PAGES_PER_RUN")
    deadline = time.monotonic() + (max_seconds or conf.get("ATLAS_WEBHOOK_MAX_SECONDS_PER_RUN"))
    pages = 0
    while True:
        began = time.monotonic()
        step = delivery.deliver_next_page(subscription_id)
        if step.outcome == "delivered":
            pages += 1
            if pages >= max_pages or time.monotonic() >= deadline:
                enqueue_pump(subscription_id)
                return "yielded"
            if not step.full:
                _coalesce(subscription_id, since=began)
            continue
        if step.outcome == "idle":
            # The row is released now. A wake that came while we held it was
            # turned away as "busy": look again so its changeset is not left
            # waiting for the beat.
            if _behind(Subscription.objects.filter(pk=subscription_id).first()):
                continue
            return "idle"
        if step.outcome == "narrowed":
            continue  # its first changeset alone, at once
        if step.outcome == "failed" and step.retry_in is not None:
            enqueue_pump(subscription_id, countdown=step.retry_in)
        return step.outcome


def _behind(subscription: Subscription | None) -> bool:
    """Whether the feed holds records past the subscription's cursor (in its namespaces)."""
    return subscription is not None and feed.has_records_after(
        after_seq=subscription.cursor_seq, namespaces=subscription.namespaces or None
    )


def _coalesce(subscription_id: str, *, since: float) -> None:
    """After a page that was not full: if more has committed meanwhile, let it
    gather until ``ATLAS_WEBHOOK_COALESCE_MS`` after the last delivery began.

    Under load a pump would otherwise send one small page per commit, and a
    delivery costs far more than a record (the claim, the page read, signing,
    the POST); a quiet subscription waits for nothing (nothing new: no sleep).
    The wait holds the subscription's row, as a delivery does, so a pump woken
    meanwhile finds it busy and leaves instead of sending the small page this
    one is waiting to grow; this run delivers it right after.
    """
    pause = since + float(conf.get("ATLAS_WEBHOOK_COALESCE_MS")) / 1000 - time.monotonic()
    if pause <= 0:
        return
    with transaction.atomic():
        subscription = (
            Subscription.objects.select_for_update(skip_locked=True)
            .filter(pk=subscription_id)
            .only("cursor_seq", "namespaces")
            .first()
        )
        if _behind(subscription):
            time.sleep(pause)


def enqueue_pump(subscription_id: str, *, countdown: float | None = None) -> None:
    """Queue a pump run for one subscription (raises when the broker is unreachable)."""
    if countdown:
        pump.apply_async(args=(str(subscription_id),), countdown=countdown)
    else:
        pump.delay(str(subscription_id))


# A subscription is due when it is active, not parked and not waiting out a
# backoff: its pump may be woken. SQL, not a Q, because the journal decides it
# inside its claim-and-delete statement (changesets.outbox.journal); alias ``s``.
DUE = (
    "s.active AND s.parked_seq IS NULL"
    " AND (s.next_attempt_at IS NULL OR s.next_attempt_at <= now())"
)
# ... and concerned by a changeset touching the namespaces in ``{names}`` (an
# SQL array expression): it follows every namespace, or one of those.
CONCERNED = "(s.namespaces = '{{}}' OR s.namespaces && {names})"


def subscriptions_for(namespaces: Sequence[str]) -> list[str]:
    """Ids of due, active subscriptions that a changeset in ``namespaces`` concerns."""
    sql = (
        f"SELECT s.id FROM changesets_subscription s WHERE {DUE}"
        f" AND {CONCERNED.format(names='%s::varchar[]')} ORDER BY s.id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [list(namespaces)])
        return [str(row[0]) for row in cursor.fetchall()]


def wake(subscription_ids: Sequence[str]) -> int:
    """Queue a pump for each subscription (raises when the broker is unreachable)."""
    for subscription_id in subscription_ids:
        enqueue_pump(subscription_id)
    return len(subscription_ids)


def wake_pumps(*, namespaces: Sequence[str]) -> int:
    """Queue a pump for every due subscription a changeset in ``namespaces`` concerns.

    Subscriptions in backoff are skipped: their retry is already scheduled.
    Raises when the broker is unreachable (the journal entry then stays
    outstanding and is retried).
    """
    return wake(subscriptions_for(namespaces))


def wake_due_subscriptions() -> int:
    """Queue a pump for every due, active subscription with something to deliver.

    The beat safety net: covers pump messages lost to a killed worker or a
    restarted broker, and retries whose scheduled message went missing.
    """
    woken = 0
    due = Subscription.objects.raw(
        f"SELECT s.id, s.cursor_seq, s.namespaces FROM changesets_subscription s WHERE {DUE}"
    )
    for subscription in due:
        if _behind(subscription):
            enqueue_pump(str(subscription.id))
            woken += 1
    return woken


# --- Celery tasks (acks_late: see changesets.tasks) -----------------------------------------


@shared_task(name="changesets.subscription_pump", acks_late=True)
def pump(subscription_id: str) -> str:
    """Deliver a subscription's pending pages (one worker at a time per subscription)."""
    return subscription_pump(subscription_id=subscription_id)


@shared_task(name="changesets.subscriptions_wake", acks_late=True)
def subscriptions_wake() -> int:
    """Beat: queue a pump for every due subscription with something to deliver."""
    return wake_due_subscriptions()
