"""Post-commit work for committed changesets (DESIGN "Post-commit work: the journal").

The write transaction inserts a journal entry (``committed``) with the
changeset. After commit, :func:`publish` finishes a batch of entries: the
journal relay calls it for the entries that committed since its last wake,
the beat sweep and ``manage.py recover_batches`` for what was left behind.

**Publishing deletes the entry.** The journal is a queue of work still owed,
not a log: nothing reads a finished entry (the change feed is derived from
revisions, never from the journal), and keeping one cost 144 bytes per write
(issue 16). So the table holds only outstanding entries, failing ones among
them, and a baseline changeset without an entry is one whose work is done.

Publishing is set-based: the work for N entries is a constant number of
statements, and at most one broker message per subscription woken, never
one per changeset. What it does depends on what is registered:

- **No ``changeset_committed`` hooks** (the default): one statement claims
  the entries (``FOR UPDATE SKIP LOCKED``, so two runners never work on one
  entry and a runner that finds one claimed moves on), deletes them and
  returns the due subscriptions they concern; their pumps are queued before
  COMMIT. With no subscriptions that is all: no ORM object per entry, no
  Celery task.
- **Hooks registered**: the entries are claimed and loaded with their
  changesets, each entry's hooks run in a savepoint of their own (a failed
  attempt keeps none of that entry's hook writes), the pumps of the
  subscriptions the successful entries concern are queued once, then one
  statement deletes the successes and one records the failures.

A failure (a hook raised; the broker refused a pump) records ``last_error``,
counts the failure on the entry and in ``JournalTally`` (the exported
counter), and leaves the entry ``committed``; the sweep retries it. A second
run of a published entry finds nothing to claim and changes nothing: its
outcome is ``already_published``, told from ``missing`` by the changeset row
(a baseline changeset without an entry has been published). Hooks may still
run more than once (a crash after they ran, before the commit), so they must
be idempotent.
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

from changesets.models import BASELINE, Changeset, JournalEntry, JournalPhase
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
# runner holds), delete them, and return them with the due subscriptions they
# concern: the claim is a subquery of the DELETE, so the lock and the removal
# are one step, and the whole publish is one statement. A rollback (the pumps
# could not be queued) puts them back as they were.
_CLAIM_AND_DELETE = f"""
WITH claimed AS (
    DELETE FROM changesets_journalentry j
    WHERE j.changeset_id IN (
        SELECT changeset_id FROM changesets_journalentry
        WHERE changeset_id = ANY(%(ids)s::uuid[]) AND phase = 'committed'
        FOR UPDATE SKIP LOCKED
    )
    RETURNING j.changeset_id, j.seq
), touched AS (
    SELECT DISTINCT unnest(c.namespaces) AS name
    FROM claimed m JOIN changesets_changeset c ON c.seq = m.seq
)
SELECT
    ARRAY(SELECT changeset_id FROM claimed),
    ARRAY(
        SELECT s.id::text FROM changesets_subscription s
        WHERE {pumps.DUE} AND {pumps.CONCERNED.format(names="ARRAY(SELECT name FROM touched)")}
        ORDER BY s.id
    )
"""

# The hooks path's successes, already claimed (locked) by this transaction.
_DELETE_DONE = "DELETE FROM changesets_journalentry WHERE changeset_id = ANY(%(ids)s::uuid[])"

# Each failed entry's attempt and error, and the failures added to the tally (an
# upsert, so a missing tally row is made): one statement for any number.
_RECORD_FAILURES = """
WITH failed AS (
    UPDATE changesets_journalentry j
    SET attempts = j.attempts + 1, failures = j.failures + 1, last_error = f.error
    FROM unnest(%(ids)s::uuid[], %(errors)s::text[]) AS f(changeset_id, error)
    WHERE j.changeset_id = f.changeset_id AND j.phase = 'committed'
    RETURNING 1
)
INSERT INTO changesets_journaltally AS t (id, failures)
SELECT 1, count(*) FROM failed
ON CONFLICT (id) DO UPDATE SET failures = t.failures + EXCLUDED.failures
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

    Outcomes: ``published`` (by this call: the entry is gone), ``already_published``
    (no entry, but its baseline changeset is there: published before), ``committed``
    (this attempt failed; see ``last_error``), ``busy`` (another runner holds it) or
    ``missing`` (no such baseline changeset here: an unknown id, a branch changeset,
    or one archived since). ``wake`` queues the pumps of the subscriptions concerned
    (default :func:`pumps.wake`, at once; the relay passes its throttle) and raises
    when the broker refuses.
    """
    ids = list(dict.fromkeys(_uuid(i) for i in changeset_ids))
    if not ids:
        return {}
    wake = wake or pumps.wake
    outcomes = (
        _publish_with_hooks(ids, wake) if hooks_registered() else _publish_deleting(ids, wake)
    )
    left = [i for i in ids if i not in outcomes]
    if left:
        outcomes.update(_unclaimed(left))
    return {i: outcomes[i] for i in ids}


def _unclaimed(ids: list[UUID]) -> dict[UUID, str]:
    """Why these were not claimed, in one query: the changeset and its entry, if any.

    The entry commits with its changeset (invariant 2), so a baseline changeset
    without one has been published; an entry still ``committed`` is held by
    another runner (it was skipped as locked). A ``published`` entry is one an
    older process marked during an upgrade (``JournalPhase.PUBLISHED``).
    """
    found = dict(
        Changeset.objects.filter(pk__in=ids, branch=BASELINE).values_list("pk", "journal__phase")
    )
    outcomes: dict[UUID, str] = {}
    for i in ids:
        if i not in found:
            outcomes[i] = MISSING
        elif found[i] == JournalPhase.COMMITTED:
            outcomes[i] = BUSY
        else:
            outcomes[i] = ALREADY_PUBLISHED
    return outcomes


def _publish_deleting(ids: list[UUID], wake: Wake) -> dict[UUID, str]:
    """No hooks: claim, delete and find the subscriptions in one statement, queue
    their pumps, then COMMIT (so a refused pump message leaves every entry in place)."""
    claimed: list[UUID] = []
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_CLAIM_AND_DELETE, {"ids": ids})
            deleted, subscription_ids = cursor.fetchone()
            claimed = [_uuid(changeset_id) for changeset_id in deleted]
            if claimed and subscription_ids:
                _wake_subscriptions(subscription_ids, wake)
    except WakeFailed as exc:  # rolled back: the entries are outstanding again
        error = f"wake pumps: {exc.__cause__!r}"
        _record_failures([(changeset_id, error) for changeset_id in claimed])
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
        if done:
            with connection.cursor() as cursor:
                cursor.execute(_DELETE_DONE, {"ids": [entry.pk for entry in done]})
        _record_failures([(entry.pk, error) for entry, error in failed])
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


def _record_failures(failed: list[tuple[UUID, str]]) -> None:
    """Count a failed attempt on each entry, with its error, and in the tally."""
    if failed:
        with connection.cursor() as cursor:
            cursor.execute(
                _RECORD_FAILURES,
                {
                    "ids": [changeset_id for changeset_id, _ in failed],
                    "errors": [error[:MAX_ERROR_LENGTH] for _, error in failed],
                },
            )


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
