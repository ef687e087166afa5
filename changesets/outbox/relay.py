"""The journal relay: the worker side enqueues post-commit work, not the request.

Every journal insert notifies channel ``atlas_journal`` (a statement trigger,
migration 0010; PostgreSQL delivers it at commit). The relay LISTENs on its
own connection, and on each notification (or every
``ATLAS_JOURNAL_RELAY_POLL_SECONDS`` without one) reads the entries committed
since its last wake and enqueues ``journal_publish_batch`` for them, up to
``BATCH`` ids a message. This is the transactional-outbox relay: the journal
table is the outbox, and the web tier does no broker work at all. Publishing
from the request cost about 0.8 ms of CPU a write (Celery and kombu build a
Redis client per message), and one message per batch amortizes it under load.

It runs in every Celery worker's main process (``worker_ready``), or alone
(``manage.py journal_relay``); a session advisory lock keeps one relay
active, and the others take over within a poll interval when its session
ends. Each entry is enqueued once, in seq order (see
:meth:`JournalRelay.relay_pending`); one that is still ``committed`` later
(a lost message, failed hooks, workers down) is the beat sweep's and
``recover_batches``'s, as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection

from changesets.tasks import journal_publish_batch

logger = logging.getLogger(__name__)

CHANNEL = "atlas_journal"
# pg_try_advisory_lock key: the bytes of "atlasrly" as a bigint.
LOCK_KEY = int.from_bytes(b"atlasrly", "big") - (1 << 63)
BATCH = 200


class JournalRelay:
    """One relay loop; :meth:`run` until ``stop`` is set (in its own thread)."""

    def __init__(
        self, *, poll_seconds: float | None = None, linger_seconds: float | None = None
    ) -> None:
        self.poll_seconds = (
            settings.ATLAS_JOURNAL_RELAY_POLL_SECONDS if poll_seconds is None else poll_seconds
        )
        self.linger_seconds = (
            settings.ATLAS_JOURNAL_RELAY_LINGER_MS / 1000
            if linger_seconds is None
            else linger_seconds
        )
        self.stop = threading.Event()
        self.active = threading.Event()  # holds the lock and is listening
        self.mark: int | None = None  # see relay_pending
        self.enqueued_total = 0
        self.thread: threading.Thread | None = None

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

    def _session(self) -> None:
        # This thread's own connection, used raw (psycopg, autocommit): the lock
        # and the LISTEN belong to its session, so nothing may swap it underneath.
        connection.ensure_connection()
        raw = connection.connection
        if not raw.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY]).fetchone()[0]:
            self.stop.wait(self.poll_seconds)  # another relay is active
            return
        raw.execute(f"LISTEN {CHANNEL}")
        self.mark = None
        self.active.set()
        while not self.stop.is_set():
            self.relay_pending(raw)
            self._wait(raw)

    def _wait(self, raw: Any) -> None:
        """Until the first notification (any number may have queued: the next
        relay_pending covers them all), the poll interval, or ``stop``."""
        deadline = time.monotonic() + self.poll_seconds
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for _ in raw.notifies(timeout=min(left, 1.0), stop_after=1):
                # Linger a moment so that commits close behind this one share its
                # message: one enqueue costs ~0.8 ms of CPU however many ids it carries.
                if self.linger_seconds:
                    self.stop.wait(self.linger_seconds)
                return

    def relay_pending(self, raw: Any) -> int:
        """Enqueue the entries committed past the mark; return how many.

        The mark is a seq: seq order is commit order (invariant 6), so once an
        entry past the mark is seen, every entry before it has committed. Each
        wake reads only what committed since the last one, however large the
        backlog of unpublished entries behind the mark (workers down): those
        are the beat sweep's. A session starts its mark before the oldest
        outstanding entry, so a relay that takes over enqueues what the
        previous one left.
        """
        if self.mark is None:
            self.mark = raw.execute(
                "SELECT COALESCE((SELECT min(c.seq) - 1 FROM changesets_journalentry j"
                " JOIN changesets_changeset c ON c.id = j.changeset_id"
                " WHERE j.phase = 'committed'),"
                " (SELECT COALESCE(max(seq), 0) FROM changesets_changeset))"
            ).fetchone()[0]
        count = 0
        while not self.stop.is_set():
            # One statement, one snapshot: the newest seq is read with the rows, so
            # nothing can commit between them and be skipped by the new mark.
            rows = raw.execute(
                "(SELECT c.seq, j.changeset_id FROM changesets_changeset c"
                " JOIN changesets_journalentry j ON j.changeset_id = c.id"
                " WHERE c.seq > %s AND j.phase = 'committed' ORDER BY c.seq LIMIT %s)"
                " UNION ALL SELECT COALESCE(max(seq), 0), NULL FROM changesets_changeset",
                [self.mark, BATCH],
            ).fetchall()
            newest = next(seq for seq, changeset_id in rows if changeset_id is None)
            found = sorted((seq, str(i)) for seq, i in rows if i is not None)
            if found:
                try:
                    journal_publish_batch.apply_async(args=([i for _, i in found],), retry=False)
                except Exception:  # noqa: BLE001 - broker down: the mark stays; next wake retries
                    logger.warning(
                        "journal relay: could not enqueue %d id(s)", len(found), exc_info=True
                    )
                    return count
                count += len(found)
                self.enqueued_total += len(found)
            if len(found) < BATCH:
                # Nothing else outstanding up to the newest seq of this snapshot
                # (the rest past the mark were published, or branch changesets).
                self.mark = max(self.mark, newest)
                return count
            self.mark = found[-1][0]
        return count


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
    if settings.ATLAS_JOURNAL_RELAY_IN_WORKER and _worker_relay is None:
        _worker_relay = start_in_thread()


def on_worker_shutdown(**_: Any) -> None:
    if _worker_relay is not None:
        _worker_relay.stop.set()
