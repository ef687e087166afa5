"""Getting a committed changeset's journal entry to a Celery worker.

The journal entry is committed with the changeset, so this is only the fast
path to the worker; nothing is lost if it never happens (the beat sweep
publishes entries left ``committed``, ``manage.py recover_batches`` finishes
them on demand). ``ATLAS_JOURNAL_PUBLISH`` chooses the path:

- ``relay`` (the default): nothing happens in the web process. The journal
  insert notified the journal relay, which runs in the workers and enqueues
  batches (``changesets.relay``). Enqueueing a Celery task costs about 0.8 ms
  of CPU (kombu builds a Redis client per message); this moves it out of the
  web tier and amortizes it over a batch.
- ``thread``: a commit hook puts the id on an in-process queue and returns;
  one daemon thread per process enqueues the tasks. At interpreter exit the
  thread gets a few seconds to finish the queue.
- ``inline``: the commit hook enqueues the task itself, in the request.

An eager Celery app (``CELERY_TASK_ALWAYS_EAGER``) always publishes inline:
the task then runs right there, as eager callers expect.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

# How long interpreter exit waits for the queue to empty.
EXIT_FLUSH_SECONDS = 5.0


def publish(changeset_id: Any) -> None:
    """Enqueue the journal task now; a broker outage leaves the entry for the sweep."""
    try:
        from changesets.tasks import journal_publish

        # No publish retries: with the broker down, each retry would hold up
        # the queue behind it; the beat sweep finishes entries left committed.
        journal_publish.apply_async(args=[str(changeset_id)], retry=False)
    except Exception:  # noqa: BLE001 - the write is committed; the sweep will finish it
        logger.warning(
            "could not enqueue journal publish for %s; the sweep will finish it",
            changeset_id,
            exc_info=True,
        )


class _Publisher:
    """One queue and one thread per process (recreated in a forked child)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pid: int | None = None
        self._queue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition(self._guard)

    def submit(self, changeset_id: Any) -> None:
        with self._guard:
            if self._pid != os.getpid():  # first use, or a child after fork
                self._pid = os.getpid()
                self._queue = queue.SimpleQueue()
                self._pending = 0
                threading.Thread(target=self._run, name="atlas-publisher", daemon=True).start()
            self._pending += 1
            self._queue.put(str(changeset_id))

    def _run(self) -> None:
        q = self._queue
        while True:
            changeset_id = q.get()
            try:
                publish(changeset_id)
            finally:
                with self._guard:
                    self._pending -= 1
                    if not self._pending:
                        self._idle.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until every submitted id was handed to the broker (or given up on)."""
        deadline = time.monotonic() + timeout
        with self._guard:
            if self._pid != os.getpid():
                return True
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True


_publisher = _Publisher()


def publish_soon(changeset_id: Any) -> None:
    """After COMMIT: get ``changeset_id``'s journal entry to a worker, as
    ``ATLAS_JOURNAL_PUBLISH`` says (see module doc and ``changesets.relay``)."""
    from changesets.tasks import journal_publish

    mode = settings.ATLAS_JOURNAL_PUBLISH
    if mode == "inline" or journal_publish.app.conf.task_always_eager:
        publish(changeset_id)
    elif mode == "thread":
        _publisher.submit(changeset_id)
    # "relay": the journal insert has notified the relay; nothing to do here.


def flush(timeout: float = EXIT_FLUSH_SECONDS) -> bool:
    """Wait for the background publisher to empty its queue; False on timeout."""
    return _publisher.flush(timeout)


atexit.register(flush)
