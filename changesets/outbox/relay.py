"""The journal relay: post-commit work is done beside the workers, not in the request.

Every journal insert notifies channel ``atlas_journal`` (a statement trigger,
migration 0010; PostgreSQL delivers it at commit). The relay LISTENs on its
own connection, and on each notification (or every
``ATLAS_JOURNAL_RELAY_POLL_SECONDS`` without one) reads the entries committed
since its last wake, up to ``BATCH`` at a time, and publishes them
(:func:`changesets.outbox.journal.publish`): with no ``changeset_committed``
hooks registered that is a statement or two per batch and one pump message
per subscription woken, done right here; with hooks it enqueues
``journal_publish_batch`` (one message per batch) so the hooks run in a
worker with Celery's retries. This is the transactional-outbox relay: the
journal table is the outbox, and the web tier does no broker work at all.

Why not a Celery task per batch in every case: publishing N changesets is a
constant number of statements, while a task costs the relay a message and a
worker process a task run (measured at several ms of CPU per changeset with
one task per changeset; docs/benchmarks.md, "HTTP throughput"). The relay
lingers ``ATLAS_JOURNAL_RELAY_LINGER_MS`` after a notification so that
commits close behind one another share one batch, and under a stream of
commits (its last pass published something less than
``ATLAS_JOURNAL_RELAY_STREAM_LINGER_MS`` ago) until that long after the last
pass: a pass costs the same few statements however many entries it carries,
so one writer committing every few milliseconds no longer costs a pass per
commit (:meth:`JournalRelay.linger`).

It runs in every Celery worker's main process (``worker_ready``), or alone
(``manage.py journal_relay``); a session advisory lock keeps one relay
active, and the others take over within a poll interval when its session
ends.

The lock and the LISTEN need a session of their own. Behind a transaction
pooler (``ATLAS_DB_POOLING=transaction``) the relay takes them on a
connection of its own to ``ATLAS_DIRECT_DATABASE_URL`` (PostgreSQL itself)
and publishes through the pooled connection as everything else does; with
no direct URL it **polls** instead: every relay reads for outstanding
entries each ``ATLAS_JOURNAL_RELAY_POLL_SECONDS``, with no lock and no
LISTEN. That is safe without a leader because publishing claims entries
``FOR UPDATE SKIP LOCKED`` (``journal``): two relays never publish one entry,
they only both look. Entries are handled once each, in seq order (see
:meth:`JournalRelay.relay_pending`); one still ``committed`` later (failed
hooks, a lost message, a relay that was down) is the beat sweep's and
``recover_batches``'s.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from math import inf
from typing import Any

import psycopg
from django.db import DatabaseError, connection

from atlas import conf
from changesets import partitions
from changesets.outbox import journal, pumps
from changesets.tasks import journal_publish_batch

logger = logging.getLogger(__name__)

CHANNEL = "atlas_journal"
# pg_try_advisory_lock key: the bytes of "atlasrly" as a bigint.
LOCK_KEY = int.from_bytes(b"atlasrly", "big") - (1 << 63)
BATCH = 200
# The wake query: the next outstanding entries after the mark, in seq order.
# A seek on the partial index ``journal_pending`` whatever the backlog
# (tests/changesets/test_publish_sets.py checks the plan at 100,000 outstanding).
NEXT_BATCH = (
    "SELECT seq, changeset_id FROM changesets_journalentry"
    " WHERE phase = 'committed' AND seq > %s ORDER BY seq LIMIT %s"
)


class JournalRelay:
    """One relay loop; :meth:`run` until ``stop`` is set (in its own thread)."""

    def __init__(
        self,
        *,
        poll_seconds: float | None = None,
        linger_seconds: float | None = None,
        stream_linger_seconds: float | None = None,
    ) -> None:
        self.poll_seconds = (
            conf.get("ATLAS_JOURNAL_RELAY_POLL_SECONDS") if poll_seconds is None else poll_seconds
        )
        self.linger_seconds = (
            conf.get("ATLAS_JOURNAL_RELAY_LINGER_MS") / 1000
            if linger_seconds is None
            else linger_seconds
        )
        self.stream_linger_seconds = (
            conf.get("ATLAS_JOURNAL_RELAY_STREAM_LINGER_MS") / 1000
            if stream_linger_seconds is None
            else stream_linger_seconds
        )
        self.last_pass: tuple[float, int] | None = None  # (when it ended, entries it handed over)
        self.stop = threading.Event()
        self.active = threading.Event()  # holds the lock and is listening
        self.mark: int | None = None  # see relay_pending
        self.enqueued_total = 0  # ids sent to workers (hooks registered)
        self.published_total = 0  # entries this relay published itself
        self.thread: threading.Thread | None = None
        self.wakes = WakeThrottle(conf.get("ATLAS_WEBHOOK_COALESCE_MS") / 1000)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._session()
            except (DatabaseError, psycopg.Error):
                # The server restarted, the session was killed, the network blinked:
                # the lock and the LISTEN went with the session; start a new one.
                logger.warning("journal relay: database error; reconnecting", exc_info=True)
            except Exception:  # noqa: BLE001 - the relay must outlive any one bad wake
                logger.exception("journal relay: unexpected error; restarting the session")
            finally:
                self.active.clear()
                with contextlib.suppress(Exception):
                    connection.close()
            self.stop.wait(min(self.poll_seconds, 1.0))

    @property
    def mode(self) -> str:
        """``listen`` (leader lock and LISTEN on a session) or ``poll`` (no session)."""
        if conf.get("ATLAS_DB_POOLING") == "transaction" and not conf.get(
            "ATLAS_DIRECT_DATABASE_URL"
        ):
            return "poll"
        return "listen"

    def _session(self) -> None:
        if self.mode == "poll":
            self._poll()
        elif conf.get("ATLAS_DB_POOLING") == "transaction":
            # The lock and the LISTEN on a session of our own, past the pooler.
            with psycopg.connect(conf.get("ATLAS_DIRECT_DATABASE_URL"), autocommit=True) as direct:
                self._lead(direct)
        else:
            # This thread's own connection, used raw (psycopg, autocommit): the lock
            # and the LISTEN belong to its session, so nothing may swap it underneath.
            connection.ensure_connection()
            self._lead(connection.connection)

    def _lead(self, raw: Any) -> None:
        if not raw.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY]).fetchone()[0]:
            self.stop.wait(self.poll_seconds)  # another relay is active
            return
        raw.execute(f"LISTEN {CHANNEL}")
        self.mark = None
        self.active.set()
        while not self.stop.is_set():
            handed = self.relay_pending(raw)
            self.last_pass = (time.monotonic(), handed)
            self.wakes.flush()
            self._wait(raw)

    def _poll(self) -> None:
        """No session to hold a lock or a LISTEN in: look every poll interval."""
        self.mark = None
        self.active.set()
        while not self.stop.is_set():
            connection.ensure_connection()
            self.relay_pending(connection.connection)
            self.wakes.flush()
            deadline = time.monotonic() + self.poll_seconds
            due = self.wakes.next_due()
            self.stop.wait(
                max(min(deadline, due if due is not None else deadline) - time.monotonic(), 0)
            )

    def _wait(self, raw: Any) -> None:
        """Until the first notification (any number may have queued: the next
        relay_pending covers them all), a held-back pump wake falls due, the poll
        interval, or ``stop``."""
        deadline = time.monotonic() + self.poll_seconds
        due = self.wakes.next_due()
        if due is not None:
            deadline = min(deadline, due)
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for _ in raw.notifies(timeout=min(left, 1.0), stop_after=1):
                # Linger so that commits close behind this one share its batch: a
                # batch costs the same few statements however many it carries.
                linger = self.linger(time.monotonic())
                if linger:
                    self.stop.wait(linger)
                return

    def linger(self, now: float) -> float:
        """How long to wait after a notification before the next pass (seconds).

        After a quiet spell, ``ATLAS_JOURNAL_RELAY_LINGER_MS``: a lone commit
        reaches the pumps as soon as that allows. While commits stream in (the
        last pass handed entries over less than the stream linger ago), until
        the stream linger has passed since that pass: under a steady stream
        the relay then passes at most every ``ATLAS_JOURNAL_RELAY_STREAM_LINGER_MS``
        whatever the commit rate, and a commit waits at most that long.
        Deliveries under load are coalesced for longer still
        (``ATLAS_WEBHOOK_COALESCE_MS``), so subscribers see no difference there.
        """
        if self.last_pass is not None:
            ended, handed = self.last_pass
            since = now - ended
            if handed and since < self.stream_linger_seconds:
                return max(self.linger_seconds, self.stream_linger_seconds - since)
        return self.linger_seconds

    def relay_pending(self, raw: Any) -> int:
        """Publish (or, with hooks registered, enqueue) the entries past the mark; how many.

        The mark is a seq: seq order is commit order (invariant 6), so once an
        entry past the mark is seen, every entry before it has committed. The
        read is one seek on ``journal_pending`` (outstanding entries by seq),
        however large the backlog. An entry left behind the mark (its hooks
        failed, another runner held it, its message was lost) is the beat
        sweep's. A session starts its mark before the oldest outstanding
        entry, so a relay that takes over finishes what the previous one left.
        """
        if self.mark is None:
            self.mark = raw.execute(
                "SELECT COALESCE((SELECT min(seq) - 1 FROM changesets_journalentry"
                " WHERE phase = 'committed'),"
                " (SELECT COALESCE(max(seq), 0) FROM changesets_changeset))"
            ).fetchone()[0]
        count = 0
        while not self.stop.is_set():
            found = raw.execute(NEXT_BATCH, [self.mark, BATCH]).fetchall()
            if not found:
                return count
            ids = [str(changeset_id) for _, changeset_id in found]
            if not self._hand_over(ids):
                return count  # the mark stays: the next wake tries these again
            count += len(ids)
            self.mark = found[-1][0]
            _partition_headroom(self.mark)
            if len(found) < BATCH:
                return count
        return count

    def _hand_over(self, ids: list[str]) -> bool:
        """Publish ``ids`` here, or enqueue them when hooks must run in a worker.

        Hooks are user code with the Celery retry semantics they were promised
        (``changesets.signals``); without any, publishing is a statement or two
        and a Celery message would cost more than the work it carries.
        """
        if journal.hooks_registered():
            try:
                journal_publish_batch.apply_async(args=(ids,), retry=False)
            except Exception:  # noqa: BLE001 - broker down: the mark stays; next wake retries
                logger.warning("journal relay: could not enqueue %d id(s)", len(ids), exc_info=True)
                return False
            self.enqueued_total += len(ids)
            return True
        outcomes = journal.publish(ids, wake=self.wakes.wake)
        if any(outcome == journal.COMMITTED for outcome in outcomes.values()):
            return False  # the pumps could not be woken (broker down): recorded; retried
        self.published_total += sum(outcome == journal.PUBLISHED for outcome in outcomes.values())
        return True


def _partition_headroom(seq: int) -> None:
    """The cheap partition check no deployment can miss (``changesets.partitions``):
    every committed changeset passes the relay, and ``seq`` is the newest it saw (no
    statement; the catalog only when the last partition is near). Its failure is
    logged, never the relay's."""
    try:
        partitions.check_headroom(seq=seq)
    except Exception:  # noqa: BLE001 - upkeep is retried by the next check and by beat
        logger.exception("revision partition upkeep failed")


class WakeThrottle:
    """At most one pump message per subscription per ``interval`` (leading and trailing).

    Under load the relay publishes a batch every few milliseconds, and each
    would wake the same pumps again; a pump already delivering only finds its
    row busy, so those messages are pure cost. The first wake goes at once (a
    quiet subscription's latency is unchanged); wakes within ``interval`` of
    the last one sent are held back and sent together when it has passed, so
    nothing committed is left without a wake after it. A held-back wake the
    broker refuses stays held and is retried; the beat wake-up is the net for
    a relay that dies holding one.
    """

    def __init__(self, interval: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.sent: dict[str, float] = {}  # subscription id -> when its last wake went
        self.held: dict[str, float] = {}  # subscription id -> when its held wake is due

    def wake(self, subscription_ids: Sequence[str]) -> None:
        """Wake these now, or hold them back; raises when the broker refuses."""
        now = self.clock()
        for subscription_id in subscription_ids:
            due = self.sent.get(subscription_id, -inf) + self.interval
            if due <= now:
                pumps.enqueue_pump(subscription_id)
                self.sent[subscription_id] = now
                self.held.pop(subscription_id, None)
            else:
                self.held[subscription_id] = due

    def next_due(self) -> float | None:
        return min(self.held.values(), default=None)

    def flush(self) -> None:
        """Send the held wakes that are due (a refusal keeps them held)."""
        now = self.clock()
        for subscription_id in [s for s, due in self.held.items() if due <= now]:
            try:
                pumps.enqueue_pump(subscription_id)
            except Exception:  # noqa: BLE001 - kept held: retried at the next flush
                logger.warning("journal relay: could not wake %s", subscription_id, exc_info=True)
                return
            self.sent[subscription_id] = now
            del self.held[subscription_id]


_worker_relay: JournalRelay | None = None


def start_in_thread(relay: JournalRelay | None = None) -> JournalRelay:
    """Run ``relay`` (a new one by default) in a daemon thread (``relay.thread``)."""
    relay = relay or JournalRelay()
    relay.thread = threading.Thread(target=relay.run, name="atlas-journal-relay", daemon=True)
    relay.thread.start()
    return relay


def on_worker_ready(**_: Any) -> None:
    """``celery.signals.worker_ready``: start the relay in the worker's main process."""
    global _worker_relay
    if conf.get("ATLAS_JOURNAL_RELAY_IN_WORKER") and _worker_relay is None:
        _worker_relay = start_in_thread()


def on_worker_shutdown(**_: Any) -> None:
    if _worker_relay is not None:
        _worker_relay.stop.set()
