"""The outbox's tables: the journal of post-commit work owed, its tally, and
the subscriptions that push the change feed (``changesets.outbox``).

The write statement inserts a journal entry beside each baseline changeset
(``changesets.services.log_statement``); everything else here is read and
written after commit, by the relay, the pumps and the sweeps. The models are
registered through ``changesets.models``, which imports them.
"""

from __future__ import annotations

import uuid6
from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class JournalPhase(models.TextChoices):
    COMMITTED = "committed"
    # Written by no code since migration 0026: publishing deletes the entry. Kept
    # so that rows an older process marks during a rolling upgrade still read as
    # done (every reader filters on ``committed``).
    PUBLISHED = "published"


class JournalEntry(models.Model):
    """Post-commit work still owed for one baseline changeset (fan-out, hooks).

    A queue, not a log: publishing deletes the entry (``changesets.outbox.journal``),
    so the table holds only outstanding work, failing entries among it, and a
    baseline changeset without an entry is one whose work is done. Nothing reads a
    finished entry (the change feed is derived from revisions), and keeping each
    one cost 144 bytes per write (issue 16).
    """

    # No key in the database (migration 0038): the changeset table is partitioned by
    # seq, so its id alone is not unique there, and a key by seq would make every
    # cut's detach of a changeset partition wait on the journal's writers.
    changeset = models.OneToOneField(
        "changesets.Changeset",
        primary_key=True,
        on_delete=models.DO_NOTHING,
        related_name="journal",
        db_constraint=False,
    )
    phase = models.CharField(
        max_length=10, choices=JournalPhase.choices, default=JournalPhase.COMMITTED
    )
    # The changeset's seq, copied so the relay's "next outstanding in seq order"
    # is one seek on ``journal_pending`` with no join (issue 15: the wake query
    # must not slow down as the backlog grows).
    seq = models.BigIntegerField()
    created_at = models.DateTimeField()
    # Always NULL since migration 0026 (a published entry is deleted). Kept, as is
    # ``phase``, for processes of the previous release still running during an
    # upgrade, which write both; the write statement names them too.
    published_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # Attempts that failed (a hook raised, or the pumps could not be woken). The
    # exported counter is ``JournalTally.failures``: this one leaves with the entry.
    failures = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name_plural = "journal entries"
        indexes = [
            models.Index(
                fields=["seq"],
                condition=Q(phase="committed"),
                name="journal_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.changeset_id} {self.phase}"


class JournalTally(models.Model):
    """Totals of the journal that must outlive its entries; one row (``id`` 1).

    ``failures`` counts failed journal attempts ever (``atlas_journal_failures_total``,
    a Prometheus counter, which must never go down). It used to be the sum of the
    entries' ``failures``, but a published entry is now deleted and its failures
    would leave the sum with it. The statement that records a failure on entries
    adds to it (``journal._RECORD_FAILURES``, an upsert: a missing row is made), so
    the row is touched only when something fails, never on the path of a write or
    of a successful publish.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    failures = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="journaltally_single_row")]

    def __str__(self) -> str:
        return f"journal: {self.failures} failed attempt(s)"


class Capture(models.TextChoices):
    """What a change-feed record carries besides the key (API.md "Change feed")."""

    NEW_VALUES = "new_values"
    NEW_ROW = "new_row"
    OLD_AND_NEW_VALUES = "old_and_new_values"


class Subscription(models.Model):
    """A push consumer of the change feed: a server-side reader with a durable cursor.

    ``cursor_seq`` is the seq of the last changeset delivered (acknowledged
    with a 2xx); it only moves forward on success, under this row's lock, so
    delivery is at-least-once and in seq order. ``namespaces`` empty means
    every namespace. ``secret`` is kept as issued: it is the HMAC key, so it
    cannot be stored hashed (``whsec_<base64>``; older rows hold 64 hex
    characters, used as their bytes). ``previous_secret`` also signs until
    ``previous_secret_expires_at`` (rotation without a gap).

    A changeset too big for one delivery goes in parts: ``part_seq`` is the
    changeset being delivered, ``part_offset`` how many of its records and
    ``parts_done`` how many parts were acknowledged; the cursor passes it only
    after its last part. A delivery that failed ``ATLAS_WEBHOOK_MAX_ATTEMPTS``
    times parks (``parked_*``) until an operator retries or skips it; while
    ``cursor_seq < narrow_through_seq`` deliveries hold one changeset each, so
    a parked delivery is always one changeset (or one part of one).
    """

    id = models.UUIDField(primary_key=True, default=uuid6.uuid7, editable=False)
    name = models.CharField(max_length=200)
    url = models.CharField(max_length=2000)
    namespaces = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    capture = models.CharField(max_length=20, choices=Capture.choices, default=Capture.NEW_VALUES)
    active = models.BooleanField(default=True)
    secret = models.CharField(max_length=128)
    cursor_seq = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    last_delivery_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # Failures since the last success; drives the backoff.
    consecutive_failures = models.PositiveIntegerField(default=0)
    # No delivery attempt before this time (backoff after a failure).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    deliveries_ok = models.BigIntegerField(default=0)
    deliveries_failed = models.BigIntegerField(default=0)
    # Rotation: the secret before the last rotate-secret, signing until the time below.
    previous_secret = models.CharField(max_length=128, blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    # A changeset delivered in parts: which one, records and parts acknowledged so far.
    part_seq = models.BigIntegerField(null=True, blank=True)
    part_offset = models.PositiveIntegerField(default=0)
    parts_done = models.PositiveIntegerField(default=0)
    # One changeset per delivery while cursor_seq is below this (isolating a bad one).
    narrow_through_seq = models.BigIntegerField(default=0)
    # The dead letter: the changeset (and part) whose delivery gave up, and why.
    parked_seq = models.BigIntegerField(null=True, blank=True)
    parked_part = models.PositiveIntegerField(null=True, blank=True)
    parked_error = models.TextField(blank=True, default="")
    parked_attempts = models.PositiveIntegerField(default=0)
    parked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(cursor_seq__gte=0), name="subscription_cursor_not_negative"
            ),
            models.CheckConstraint(
                condition=Q(capture__in=["new_values", "new_row", "old_and_new_values"]),
                name="subscription_capture_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} → {self.url}"
