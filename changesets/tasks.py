"""Celery tasks: thin, idempotent, id in, one service call."""

from __future__ import annotations

from celery import shared_task

from changesets import journal


@shared_task(name="changesets.journal_publish", acks_late=True)
def journal_publish(changeset_id: str) -> str:
    """Run post-commit work for one changeset and mark its journal entry published."""
    return journal.journal_publish(changeset_id=changeset_id)
