"""Celery tasks keep their database connection as web requests do (``CONN_MAX_AGE``).

Celery's Django fixup closes every connection after every task unless
``CELERY_DB_REUSE_MAX`` is set, so each pump and sweep task opened a new
PostgreSQL session: a backend to start, a login, and the prepared statements
to plan again, several milliseconds of CPU for a task whose work is a query
or two. Atlas applies Django's own rule around each task instead
(``close_old_connections``: keep a healthy connection until ``CONN_MAX_AGE``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from django.db import connection

from changesets.outbox.pumps import subscriptions_wake
from tests.changesets.worker_helpers import Broker, real_broker, wait_for, worker_factory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TASKS = 30


@pytest.fixture
def broker() -> Iterator[Broker]:
    with real_broker() as b:
        yield b


def sessions() -> int:
    """Sessions ever opened to the test database (``pg_stat_database``)."""
    time.sleep(1.2)  # a backend's counters reach the shared statistics within a second
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def done(log: str, ids: set[str]) -> int:
    """How many of ``ids`` the worker reports finished.

    By id, not by counting "succeeded" lines: beat and the relay send
    ``subscriptions_wake`` on their own, and one of theirs finishing first made
    the count reach ``TASKS`` with the last of ours still queued (CI saw 29).
    """
    finished = re.findall(r"subscriptions_wake\[([0-9a-f-]+)\] succeeded", log)
    return len(ids.intersection(finished))


def run_tasks(broker: Broker, **env: str) -> int:
    """Sessions a worker opened to run ``TASKS`` small database tasks, one after another."""
    with worker_factory(broker) as start:
        worker = start(**env)
        before = sessions()
        ids = {subscriptions_wake.delay().id for _ in range(TASKS)}
        wait_for(
            lambda: done(worker.log(), ids) == TASKS,
            timeout=60,
            what=f"{TASKS} tasks done",
        )
        worker.stop()
    return sessions() - before


def test_tasks_reuse_the_connection_within_conn_max_age(broker):
    opened = run_tasks(broker, ATLAS_DB_CONN_MAX_AGE="60")
    # Two pool children, the relay and beat may each connect once; not once per task.
    assert opened <= 6, opened


def test_conn_max_age_zero_still_closes_after_each_task(broker):
    opened = run_tasks(broker, ATLAS_DB_CONN_MAX_AGE="0")
    assert opened >= TASKS, opened
