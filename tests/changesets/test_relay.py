"""The journal relay (changesets/relay.py) against the real test database.

Each test runs relays in threads with their own connections (LISTEN, the
advisory lock) and commits for real; the broker is replaced by a recorder.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from atlas.celery import app as celery_app
from changesets import journal
from changesets.models import JournalEntry, Rpc
from changesets.ops import PutOp
from changesets.relay import JournalRelay, start_in_thread
from changesets.services import changeset_apply
from changesets.tasks import journal_publish_batch
from entities.store import EntityKey, baseline

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def relay_mode(settings) -> Iterator[None]:
    """The default deployment: the web process enqueues nothing, Celery not eager."""
    settings.ATLAS_JOURNAL_PUBLISH = "relay"
    before = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = False
    yield
    celery_app.conf.task_always_eager = before


@pytest.fixture
def broker(monkeypatch) -> list[list[str]]:
    """Each ``journal_publish_batch`` message the relays send (its list of ids)."""
    messages: list[list[str]] = []
    lock = threading.Lock()

    def apply_async(args, retry):
        with lock:
            messages.append(list(args[0]))

    monkeypatch.setattr(journal_publish_batch, "apply_async", apply_async)
    return messages


@pytest.fixture
def relays() -> Iterator[Callable[..., JournalRelay]]:
    started: list[JournalRelay] = []

    def start(**kw: Any) -> JournalRelay:
        relay = start_in_thread(JournalRelay(**kw))
        started.append(relay)
        return relay

    yield start
    for relay in started:
        relay.stop.set()
    for relay in started:
        relay.thread.join(10)
        assert not relay.thread.is_alive()


def wait(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def write(staff: Any, namespace: Any, n: int) -> str:
    result = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(EntityKey(namespace.name, "order", f"k{n % 3}"), {"n": n})],
        rpc=Rpc.PUT_ENTITY,
    )
    return str(result.changeset.id)


def test_a_commit_wakes_the_relay_which_enqueues_each_entry_once(
    staff, namespace, relay_mode, broker, relays
):
    # A poll interval far longer than the test: only the NOTIFY can wake it.
    relay = relays(poll_seconds=60)
    wait(relay.active.is_set, 10, "the relay to become active")
    ids = [write(staff, namespace, n) for n in range(5)]

    wait(lambda: sum(len(m) for m in broker) >= 5, 5, "the relay to enqueue five entries")
    time.sleep(0.3)  # anything more would be a duplicate
    enqueued = [i for m in broker for i in m]
    assert enqueued == ids, "each committed entry once, in commit order"
    assert relay.enqueued_total == 5


def test_entries_committed_before_the_relay_started_are_enqueued_at_once(
    staff, namespace, relay_mode, broker, relays
):
    ids = [write(staff, namespace, n) for n in range(3)]
    relays(poll_seconds=60)
    wait(lambda: [i for m in broker for i in m] == ids, 10, "the backlog to be enqueued")


def test_one_relay_is_active_and_another_takes_over_when_it_stops(
    staff, namespace, relay_mode, broker, relays
):
    first = relays(poll_seconds=0.2)
    wait(first.active.is_set, 10, "the first relay to become active")
    second = relays(poll_seconds=0.2)
    time.sleep(1.0)
    assert not second.active.is_set(), "the advisory lock admits one relay"

    first.stop.set()
    first.thread.join(10)
    wait(second.active.is_set, 10, "the standby relay to take over")
    changeset_id = write(staff, namespace, 1)
    wait(lambda: [changeset_id] in broker, 5, "the new relay to enqueue the entry")


def test_a_killed_relay_session_reconnects_and_catches_up(
    staff, namespace, relay_mode, broker, relays
):
    relay = relays(poll_seconds=0.2)
    wait(relay.active.is_set, 10, "the relay to become active")
    with connection.cursor() as cursor:  # what a server restart does to its session
        cursor.execute(  # the relay's session: the holder of the relay's advisory lock
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND pid <> pg_backend_pid()"
        )
        assert [row[0] for row in cursor.fetchall()] == [True]
    changeset_id = write(staff, namespace, 1)  # committed while the relay has no session
    wait(lambda: [changeset_id] in broker, 10, "the reconnected relay to enqueue it")
    assert relay.thread.is_alive()


def test_a_broker_outage_is_retried_at_the_next_wake(
    staff, namespace, relay_mode, relays, monkeypatch
):
    calls: list[list[str]] = []
    up = threading.Event()

    def apply_async(args, retry):
        calls.append(list(args[0]))
        if not up.is_set():
            raise ConnectionError("broker unreachable")

    monkeypatch.setattr(journal_publish_batch, "apply_async", apply_async)
    relays(poll_seconds=0.3)
    changeset_id = write(staff, namespace, 1)
    wait(lambda: len(calls) >= 1, 5, "a failed attempt")
    up.set()
    wait(lambda: len(calls) >= 2, 5, "the retry")
    assert calls[-1] == [changeset_id]
    time.sleep(0.8)
    assert calls.count([changeset_id]) == 2, "once enqueued, not enqueued again"


def test_the_batch_task_publishes_each_entry_and_counts_outcomes(staff, namespace, relay_mode):
    ids = [write(staff, namespace, n) for n in range(3)]
    journal.journal_publish(changeset_id=ids[0])

    counts = journal_publish_batch(ids + ["0" * 32])

    assert counts == {"already_published": 1, "published": 2, "missing": 1}
    assert not JournalEntry.objects.filter(phase="committed").exists()
