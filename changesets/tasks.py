"""Celery tasks of the journal: thin, idempotent, ids in, one service call.

All run with ``acks_late`` (settings), so a message is acknowledged only
after its task finished: a worker killed mid-task leaves it to be delivered
again, and every task here is safe to run twice. The beat schedule (settings,
``CELERY_BEAT_SCHEDULE``) runs the journal sweep and the subscription wake-up.

The pump's tasks (``changesets.subscription_pump``,
``changesets.subscriptions_wake``) are defined with the pump, in
:mod:`changesets.outbox.pumps`, because the journal queues pumps and this
module calls the journal; importing it here registers them wherever Celery
autodiscovers this module.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from atlas import conf
from changesets import partitions
from changesets.archive import archiver, locks, retention, storage
from changesets.outbox import (
    journal,
    pumps,  # noqa: F401 - registers the pump's tasks (module doc)
)

logger = logging.getLogger(__name__)


@shared_task(name="changesets.journal_publish", acks_late=True)
def journal_publish(changeset_id: str) -> str:
    """Run post-commit work for one changeset; its journal entry is deleted once done."""
    return journal.journal_publish(changeset_id=changeset_id)


@shared_task(name="changesets.journal_publish_batch", acks_late=True)
def journal_publish_batch(changeset_ids: list[str]) -> dict[str, int]:
    """:func:`journal.publish` for a batch (the relay's message when hooks are
    registered; see ``changesets.outbox.relay``): outcome counts. One entry's
    failure is recorded on it and the others go on; a worker lost mid-batch gets
    the batch again."""
    counts: dict[str, int] = {}
    for outcome in journal.publish(changeset_ids).values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


@shared_task(name="changesets.journal_sweep", acks_late=True)
def journal_sweep() -> dict[str, int]:
    """Beat: publish entries left ``committed`` longer than ``ATLAS_JOURNAL_SWEEP_AGE_SECONDS``."""
    return journal.journal_sweep(
        older_than_seconds=conf.get("ATLAS_JOURNAL_SWEEP_AGE_SECONDS")
    ).as_dict()


@shared_task(name="changesets.archive_retention", acks_late=True)
def archive_retention() -> dict[str, Any]:
    """Beat: cut the log where retention says (docs/retention.md) and finish any cut or
    erasure rewrite a crash left; the same archiver as ``archive_log``. Skips (and
    says so) while another archiver holds the lock or no signing key is set."""
    try:
        wanted, outcome = retention.apply()
    except locks.Busy:
        return {"status": "busy"}
    except (storage.NotConfigured, archiver.ArchiveFailed) as exc:
        logger.error("archive retention: %s", exc)
        return {"status": "failed", "error": str(exc)}
    if outcome is None:
        return {"status": "nothing", "policy": wanted.reason}
    return {
        "status": "done",
        "policy": wanted.reason,
        "cuts": [cut.seq for cut in outcome.cuts],
        "rewrites": outcome.rewrites,
        "limits": outcome.plan.limits if outcome.plan else [],
    }


@shared_task(name="changesets.partition_upkeep", acks_late=True)
def partition_upkeep() -> dict[str, Any]:
    """Beat: keep ``ATLAS_LOG_PARTITIONS_AHEAD`` revision partitions past the log head
    (``changesets.partitions``); the partitions made and the seqs of headroom left."""
    made = partitions.ensure_ahead()
    return {"made": [p.name for p in made], "headroom": partitions.headroom()}
