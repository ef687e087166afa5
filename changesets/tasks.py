"""Celery tasks: thin, idempotent, id in, one service call.

All run with ``acks_late`` (settings), so a message is acknowledged only
after its task finished: a worker killed mid-task leaves it to be delivered
again, and every task here is safe to run twice. The beat schedule (settings,
``CELERY_BEAT_SCHEDULE``) runs the two sweeps.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from changesets import delivery, journal


@shared_task(name="changesets.journal_publish", acks_late=True)
def journal_publish(changeset_id: str) -> str:
    """Run post-commit work for one changeset and mark its journal entry published."""
    return journal.journal_publish(changeset_id=changeset_id)


@shared_task(name="changesets.journal_publish_batch", acks_late=True)
def journal_publish_batch(changeset_ids: list[str]) -> dict[str, int]:
    """:func:`journal_publish` for each id, in order (the relay's message; see
    ``changesets.relay``): outcome counts. One entry's failure is recorded on it
    and the others go on; a worker lost mid-batch gets the batch again."""
    counts: dict[str, int] = {}
    for changeset_id in changeset_ids:
        outcome = journal.journal_publish(changeset_id=changeset_id)
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


@shared_task(name="changesets.journal_sweep", acks_late=True)
def journal_sweep() -> dict[str, int]:
    """Beat: publish entries left ``committed`` longer than ``ATLAS_JOURNAL_SWEEP_AGE_SECONDS``."""
    return journal.journal_sweep(
        older_than_seconds=settings.ATLAS_JOURNAL_SWEEP_AGE_SECONDS
    ).as_dict()


@shared_task(name="changesets.subscription_pump", acks_late=True)
def subscription_pump(subscription_id: str) -> str:
    """Deliver a subscription's pending pages (one worker at a time per subscription)."""
    return delivery.subscription_pump(subscription_id=subscription_id)


@shared_task(name="changesets.subscriptions_wake", acks_late=True)
def subscriptions_wake() -> int:
    """Beat: queue a pump for every due subscription with something to deliver."""
    return delivery.wake_due_subscriptions()
