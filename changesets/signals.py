"""Hooks for committed changesets.

``changeset_committed`` is sent once per baseline changeset by the journal
task, after commit, with ``changeset`` (a :class:`~changesets.models.Changeset`).
Delivery is at-least-once (a crash between a receiver and the journal update
re-runs it), so receivers must be idempotent, e.g. keyed by ``changeset.id``.
"""

from django.dispatch import Signal

changeset_committed = Signal()
