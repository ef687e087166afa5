"""Post-commit work for committed changesets (DESIGN "Post-commit work: the journal").

The write transaction inserts a journal entry (``committed``) with the
changeset. After commit, :func:`publish` finishes a batch of entries: the
journal relay calls it for the entries that committed since its last wake,
the beat sweep and ``manage.py recover_batches`` for what was left behind.

Publishing is set-based: the work for N entries is a constant number of
statements, and at most one broker message per subscription woken, never
one per changeset. What it does depends on what is registered:

- **No ``changeset_committed`` hooks** (the default): one statement claims
  the entries (``FOR UPDATE SKIP LOCKED``, so two runners never work on one
  entry and a runner that finds one claimed moves on), marks them
  ``published`` and returns the namespaces they touched; one query finds the
  due subscriptions those concern, and their pumps are queued before COMMIT.
  With no subscriptions that is all: no ORM object per entry, no Celery task.
- **Hooks registered**: the entries are claimed and loaded with their
  changesets, each entry's hooks run in a savepoint of their own (a failed
  attempt keeps none of that entry's hook writes), the pumps of the
  subscriptions the successful entries concern are queued once, and two
  statements mark the successes published and record the failures.

A failure (a hook raised; the broker refused a pump) records ``last_error``,
counts the failure and leaves the entry ``committed``; the sweep retries it.
The phase check makes a second run of a published entry a no-op. Hooks may
still run more than once (a crash after they ran, before the commit), so
they must be idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.db.models import QuerySet
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

# Claim the given entries that are still outstanding (skipping any another
# runner holds), mark them published, and return them with the due
# subscriptions they concern: the claim is a subquery of the UPDATE, so the
# lock and the mark are one step, and the whole publish is one statement.
_CLAIM_AND_MARK = f"""
WITH marked AS (
    UPDATE changesets_journalentry j
    SET phase = 'published', published_at = now(), attempts = j.attempts + 1, last_error = ''
    WHERE j.changeset_id IN (
        SELECT changeset_id FROM changesets_journalentry
        WHERE changeset_id = ANY(%(ids)s::uuid[]) AND phase = 'committed'
        FOR UPDATE SKIP LOCKED
    )
    RETURNING j.changeset_id
), touched AS (
    SELECT DISTINCT unnest(c.namespaces) AS name
    FROM marked m JOIN changesets_changeset c ON c.id = m.changeset_id
)
SELECT
    ARRAY(SELECT changeset_id FROM marked),
    ARRAY(
        SELECT s.id::text FROM changesets_subscription s
        WHERE {pumps.DUE} AND {pumps.CONCERNED.format(names="ARRAY(SELECT name FROM touched)")}
        ORDER BY s.id
    )
"""

_RECORD_FAILURE = """
UPDATE changesets_journalentry
SET attempts = attempts + 1, failures = failures + 1, last_error = %(error)s
WHERE changeset_id = ANY(%(ids)s::uuid[]) AND phase = 'committed'
"""


class HookFailed(Exception):
    """One or more ``changeset_committed`` receivers raised."""

    def __init__(self, failures: list[tuple[Any, BaseException]]) -> None:
        self.failures = failures
        names = ", ".join(
            f"{getattr(r, '__qualname__', r)}: {type(e).__name__}: {e}" for r, e in failures
        )
        super().__init__(f"{len(failures)} hook(s) failed: {names}")


class WakeFailed(Exception):
    """The pumps could not be queued (the broker is unreachable)."""


def _uuid(value: Any) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


def hooks_registered() -> bool:
    """Whether any ``changeset_committed`` receiver would run (for any sender or ours)."""
    return changeset_committed.has_listeners(sender=JournalEntry)


Wake = Callable[[Sequence[str]], Any]


def publish(changeset_ids: Sequence[Any], *, wake: Wake | None = None) -> dict[UUID, str]:
    """Finish the post-commit work of these entries; each one's outcome, by id.

    Outcomes: ``published`` (by this call), ``already_published``,
    ``committed`` (this attempt failed; see ``last_error``), ``busy``
    (another runner holds it) or ``missing``. ``wake`` queues the pumps of the
    subscriptions concerned (default :func:`pumps.wake`, at once; the relay
    passes its throttle) and raises when the broker refuses.
    """
    ids = list(dict.fromkeys(_uuid(i) for i in changeset_ids))
    if not ids:
        return {}
    wake = wake or pumps.wake
    outcomes = _publish_with_hooks(ids, wake) if hooks_registered() else _publish_marking(ids, wake)
    left = [i for i in ids if i not in outcomes]
    if left:  # not claimed: published already, held by another runner, or unknown
        phases = dict(JournalEntry.objects.filter(pk__in=left).values_list("pk", "phase"))
        for i in left:
            phase = phases.get(i)
            outcomes[i] = (
                MISSING if phase is None else ALREADY_PUBLISHED if phase == PUBLISHED else BUSY
            )
    return {i: outcomes[i] for i in ids}


def _publish_marking(ids: list[UUID], wake: Wake) -> dict[UUID, str]:
    """No hooks: claim, mark and find the subscriptions in one statement, queue
    their pumps, then COMMIT (so a refused pump message leaves nothing marked)."""
    claimed: list[UUID] = []
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_CLAIM_AND_MARK, {"ids": ids})
            marked, subscription_ids = cursor.fetchone()
            claimed = [_uuid(changeset_id) for changeset_id in marked]
            if claimed and subscription_ids:
                _wake_subscriptions(subscription_ids, wake)
    except WakeFailed as exc:  # rolled back: the entries are outstanding again
        _record_failure(claimed, f"wake pumps: {exc.__cause__!r}")
        return dict.fromkeys(claimed, COMMITTED)
    return dict.fromkeys(claimed, PUBLISHED)


def _publish_with_hooks(ids: list[UUID], wake: Wake) -> dict[UUID, str]:
    outcomes: dict[UUID, str] = {}
    with transaction.atomic():
        entries = list(
            JournalEntry.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("changeset")
            .filter(pk__in=ids, phase=JournalPhase.COMMITTED)
            .order_by("seq")
        )
        done: list[JournalEntry] = []
        failed: list[tuple[JournalEntry, str]] = []
        for entry in entries:
            try:
                _run_hooks(entry)
                done.append(entry)
            except HookFailed as exc:
                failed.append((entry, str(exc)))
        try:
            names = sorted({name for entry in done for name in entry.changeset.namespaces})
            if names:
                _wake_subscriptions(pumps.subscriptions_for(names), wake)
        except WakeFailed as exc:
            failed += [(entry, f"wake pumps: {exc.__cause__!r}") for entry in done]
            done = []
        now = timezone.now()
        for entry in done:
            entry.phase, entry.published_at, entry.last_error = JournalPhase.PUBLISHED, now, ""
            entry.attempts += 1
        for entry, error in failed:
            entry.attempts += 1
            entry.failures += 1
            entry.last_error = error[:MAX_ERROR_LENGTH]
        JournalEntry.objects.bulk_update(
            [*done, *(entry for entry, _ in failed)],
            ["phase", "published_at", "attempts", "failures", "last_error"],
        )
        outcomes.update((entry.pk, PUBLISHED) for entry in done)
        outcomes.update((entry.pk, COMMITTED) for entry, _ in failed)
    return outcomes


def _run_hooks(entry: JournalEntry) -> None:
    with transaction.atomic():  # a savepoint: a failed attempt leaves no hook writes
        results = changeset_committed.send_robust(sender=JournalEntry, changeset=entry.changeset)
        # send_robust runs every receiver and logs each failure with its traceback.
        failures = [(r, e) for r, e in results if isinstance(e, BaseException)]
        if failures:
            raise HookFailed(failures)


def _wake_subscriptions(subscription_ids: Sequence[str], wake: Wake) -> None:
    try:
        wake(subscription_ids)
    except Exception as exc:
        logger.warning("journal: could not wake pumps", exc_info=True)
        raise WakeFailed(str(exc)) from exc


def _record_failure(ids: list[UUID], error: str) -> None:
    if ids:
        with connection.cursor() as cursor:
            cursor.execute(_RECORD_FAILURE, {"ids": ids, "error": error[:MAX_ERROR_LENGTH]})


def journal_publish(*, changeset_id: Any) -> str:
    """:func:`publish` for one entry: its outcome."""
    try:
        key = _uuid(changeset_id)
    except ValueError:
        return MISSING
    return publish([key])[key]


def outstanding(*, older_than: timedelta | None = None) -> QuerySet[JournalEntry]:
    """Entries still ``committed``, oldest (lowest seq) first, off ``journal_pending``."""
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

    def add(self, outcomes: dict[UUID, str]) -> None:
        for changeset_id, outcome in outcomes.items():
            if outcome == PUBLISHED:
                self.published += 1
            elif outcome == COMMITTED:
                self.failed += 1
                self.left.append(str(changeset_id))
            elif outcome == BUSY:
                self.busy += 1


SWEEP_CHUNK = 200


def journal_sweep(*, older_than_seconds: float, limit: int = 1000) -> SweepResult:
    """Publish entries left ``committed`` for longer than ``older_than_seconds``.

    The age keeps the sweep out of the relay's way (the relay normally
    publishes within milliseconds of the commit); what is older was left
    behind by a relay that was down, a lost message or a broker outage.
    """
    result = SweepResult()
    ids = list(
        outstanding(older_than=timedelta(seconds=older_than_seconds)).values_list("pk", flat=True)[
            :limit
        ]
    )
    for start in range(0, len(ids), SWEEP_CHUNK):
        result.add(publish(ids[start : start + SWEEP_CHUNK]))
    if ids:
        logger.info("journal sweep: %s", result.as_dict())
    return result
