"""Post-commit work for committed changesets (DESIGN "Post-commit work: the journal").

The write transaction inserts a journal entry (``committed``) with the
changeset. After commit, :func:`journal_publish` (run by the Celery task the
journal relay enqueues, by the beat sweep, or by ``manage.py recover_batches``):

1. claims the entry with ``SELECT … FOR UPDATE SKIP LOCKED``, so two runners
   never work on one entry at once, and a runner that finds it claimed moves on;
2. runs the ``changeset_committed`` hooks (every receiver, inside a
   savepoint, so a failed attempt leaves none of their database writes);
3. wakes the pumps of the subscriptions the changeset concerns;
4. marks the entry ``published`` in the same transaction.

A failure in 2 or 3 records ``last_error``, counts the failure and leaves the
entry ``committed``; the sweep retries it. The phase check makes a second
run of a published entry a no-op. Hooks may still run more than once (a
crash after they ran, before the commit), so they must be idempotent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from changesets.models import JournalEntry, JournalPhase
from changesets.outbox import pumps
from changesets.signals import changeset_committed

logger = logging.getLogger(__name__)

MAX_ERROR_LENGTH = 2000
PUBLISHED = "published"
ALREADY_PUBLISHED = "already_published"
COMMITTED = "committed"
BUSY = "busy"
MISSING = "missing"


class HookFailed(Exception):
    """One or more ``changeset_committed`` receivers raised."""

    def __init__(self, failures: list[tuple[Any, BaseException]]) -> None:
        self.failures = failures
        names = ", ".join(
            f"{getattr(r, '__qualname__', r)}: {type(e).__name__}: {e}" for r, e in failures
        )
        super().__init__(f"{len(failures)} hook(s) failed: {names}")


def _run_hooks(entry: JournalEntry) -> None:
    with transaction.atomic():  # a savepoint: a failed attempt leaves no hook writes
        results = changeset_committed.send_robust(sender=JournalEntry, changeset=entry.changeset)
        # send_robust runs every receiver and logs each failure with its traceback.
        failures = [(r, e) for r, e in results if isinstance(e, BaseException)]
        if failures:
            raise HookFailed(failures)


def journal_publish(*, changeset_id: Any) -> str:
    """Finish one entry's post-commit work and mark it published.

    Returns the outcome: ``published`` (by this call), ``already_published``,
    ``committed`` (this attempt failed; see ``last_error``), ``busy`` (another
    runner holds it), or ``missing``.
    """
    with transaction.atomic():
        entry = (
            JournalEntry.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("changeset")
            .filter(pk=changeset_id)
            .first()
        )
        if entry is None:
            exists = JournalEntry.objects.filter(pk=changeset_id).exists()
            return BUSY if exists else MISSING
        if entry.phase == JournalPhase.PUBLISHED:
            return ALREADY_PUBLISHED
        entry.attempts += 1
        try:
            _run_hooks(entry)
            pumps.wake_pumps(namespaces=entry.changeset.namespaces)
        except Exception as exc:  # noqa: BLE001 - recorded; the sweep retries the entry
            if not isinstance(exc, HookFailed):
                logger.warning(
                    "journal entry %s: could not wake pumps", changeset_id, exc_info=True
                )
            message = str(exc) if isinstance(exc, HookFailed) else f"wake pumps: {exc!r}"
            JournalEntry.objects.filter(pk=entry.pk).update(
                attempts=entry.attempts,
                failures=F("failures") + 1,
                last_error=message[:MAX_ERROR_LENGTH],
            )
            return COMMITTED
        entry.phase = JournalPhase.PUBLISHED
        entry.published_at = timezone.now()
        entry.last_error = ""
        entry.save(update_fields=["phase", "published_at", "attempts", "last_error"])
        return PUBLISHED


def outstanding(*, older_than: timedelta | None = None):
    """Entries still ``committed``, oldest first (off the ``journal_pending`` index)."""
    qs = JournalEntry.objects.filter(phase=JournalPhase.COMMITTED)
    if older_than is not None:
        qs = qs.filter(created_at__lt=timezone.now() - older_than)
    return qs.order_by("seq")


@dataclass
class SweepResult:
    published: int = 0
    failed: int = 0
    busy: int = 0
    left: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        return {"published": self.published, "failed": self.failed, "busy": self.busy}


def journal_sweep(*, older_than_seconds: float, limit: int = 1000) -> SweepResult:
    """Publish entries left ``committed`` for longer than ``older_than_seconds``.

    The age keeps the sweep out of the way of the normal path (the task the
    write enqueued is normally done within milliseconds); what is older was
    left behind by a crashed worker, a lost message or a broker outage.
    """
    result = SweepResult()
    ids = list(
        outstanding(older_than=timedelta(seconds=older_than_seconds)).values_list("pk", flat=True)[
            :limit
        ]
    )
    for changeset_id in ids:
        outcome = journal_publish(changeset_id=changeset_id)
        if outcome == PUBLISHED:
            result.published += 1
        elif outcome == COMMITTED:
            result.failed += 1
            result.left.append(str(changeset_id))
        elif outcome == BUSY:
            result.busy += 1
    if ids:
        logger.info("journal sweep: %s", result.as_dict())
    return result


def entry_age(entry: JournalEntry, now: datetime | None = None) -> timedelta:
    return (now or timezone.now()) - entry.created_at
