"""Post-commit work for committed changesets (DESIGN "the journal").

Claiming an entry uses ``select_for_update(skip_locked=True)`` so two workers
never run the same entry's hooks at once, and the phase check makes a second
run a no-op.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from changesets.models import JournalEntry, JournalPhase
from changesets.signals import changeset_committed

logger = logging.getLogger(__name__)


def journal_publish(*, changeset_id: str) -> str:
    """Run the ``changeset_committed`` hooks for one entry and mark it published.

    Returns the entry's phase afterwards ("published", or "busy" when another
    worker holds it, or "missing").
    """
    with transaction.atomic():
        entry = (
            JournalEntry.objects.select_for_update(skip_locked=True)
            .select_related("changeset")
            .filter(pk=changeset_id)
            .first()
        )
        if entry is None:
            exists = JournalEntry.objects.filter(pk=changeset_id).exists()
            return "busy" if exists else "missing"
        if entry.phase == JournalPhase.PUBLISHED:
            return entry.phase
        entry.attempts += 1
        try:
            changeset_committed.send(sender=JournalEntry, changeset=entry.changeset)
        except Exception as exc:  # a hook failed: keep the entry outstanding for a retry
            logger.exception("changeset_committed hook failed for %s", changeset_id)
            JournalEntry.objects.filter(pk=entry.pk).update(
                attempts=entry.attempts, last_error=repr(exc)[:2000]
            )
            return entry.phase
        entry.phase = JournalPhase.PUBLISHED
        entry.published_at = timezone.now()
        entry.last_error = ""
        entry.save(update_fields=["phase", "published_at", "attempts", "last_error"])
        return entry.phase
