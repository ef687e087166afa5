"""Hooks for committed changesets: the post-commit extension point.

``changeset_committed`` is sent once per baseline changeset by the journal
(:func:`changesets.outbox.journal.journal_publish`), after the write committed, with
``sender=JournalEntry`` and ``changeset`` (a :class:`~changesets.models.Changeset`;
its revisions are readable: find them by its seq as well as its id,
``changeset.revisions.filter(seq=changeset.seq)``, or
``changesets.selectors.log.revisions_of(changeset)``; the revision table is
partitioned by seq and indexed by it, so by the id alone the read scans every
partition). Branch changesets are not sent until merged
(the merge is a baseline changeset).

Rules for receivers:

- **Idempotent.** Delivery is at-least-once: a crash between a receiver and
  the journal's commit, or another receiver's failure, runs every receiver
  again. Key your effects by ``changeset.id``.
- **Raise to ask for a retry.** If any receiver raises, the entry stays
  ``committed`` with the error in ``last_error``; the beat sweep retries it
  (all receivers again). Other receivers still run on that attempt.
- **Database writes are atomic with the entry.** Receivers run inside the
  journal's transaction, in a savepoint: a failed attempt leaves none of the
  receivers' writes, a successful one commits them with the entry's deletion
  (a published entry leaves the journal).
- **Quick.** The entry's row is locked while they run; slow work belongs in a
  Celery task the receiver enqueues.

Example::

    from django.dispatch import receiver
    from changesets.signals import changeset_committed

    @receiver(changeset_committed, dispatch_uid="search-index")
    def reindex(sender, changeset, **kwargs):
        for rev in changeset.revisions.filter(seq=changeset.seq):
            search.upsert_or_delete(rev.namespace, rev.kind, rev.slug, rev.after)
"""

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("changesets.hooks")


class HookSignal(Signal):
    """A Signal whose ``send_robust`` can log any failing receiver.

    Django's own failure logging reads ``receiver.__qualname__``, which a
    ``functools.partial`` or a callable object lacks: the logging would raise
    and take the journal run down with it.
    """

    def _log_robust_failure(self, receiver: Any, err: Exception) -> None:
        name = getattr(receiver, "__qualname__", None) or repr(receiver)
        logger.error("changeset_committed hook %s failed: %s", name, err, exc_info=err)


changeset_committed = HookSignal()
