"""The journal relay (changesets/outbox/relay.py) against the real test database.

Each test runs relays in threads with their own connections (LISTEN, the
advisory lock) and commits for real; the broker is replaced by a recorder.
With ``changeset_committed`` hooks registered (``hooked``) the relay enqueues
batches for the workers; without, it publishes them itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from changesets.models import JournalEntry, JournalPhase, JournalTally, Rpc
from changesets.ops import PutOp
from changesets.outbox import journal
from changesets.outbox.relay import JournalRelay, start_in_thread
from changesets.services.apply import changeset_apply
from changesets.signals import changeset_committed
from changesets.tasks import journal_publish_batch
from entities.store import EntityKey, baseline
from tests.changesets.worker_helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def relay_mode(not_eager) -> None:
    """The deployment: the web process enqueues nothing, Celery not eager."""


@pytest.fixture
def hooked() -> Iterator[None]:
    """A ``changeset_committed`` hook is registered: hooks run in workers, so the
    relay enqueues batches instead of publishing them itself."""
    changeset_committed.connect(lambda **kw: None, dispatch_uid="test-relay-hook", weak=False)
    yield
    changeset_committed.disconnect(dispatch_uid="test-relay-hook")


@pytest.fixture
def broker(monkeypatch, hooked) -> list[list[str]]:
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


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, str]]:
    """What reached ``journal_publish.apply_async``, and on which thread."""
    calls: list[tuple[str, str]] = []

    def apply_async(args, retry):
        assert retry is False
        calls.append((args[0], threading.current_thread().name))

    monkeypatch.setattr("changesets.tasks.journal_publish.apply_async", apply_async)
    return calls


def test_the_web_process_enqueues_nothing(staff, namespace, sent, relay_mode):
    changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(EntityKey(namespace.name, "order", "a"), {})],
        rpc=Rpc.PUT_ENTITY,
    )
    assert sent == []  # the journal relay (changesets.outbox.relay) enqueues it
    assert JournalEntry.objects.filter(phase="committed").count() == 1


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
    wait_for(relay.active.is_set, timeout=10, what="the relay to become active", every=0.02)
    ids = [write(staff, namespace, n) for n in range(5)]

    wait_for(
        lambda: sum(len(m) for m in broker) >= 5,
        timeout=5,
        what="the relay to enqueue five entries",
        every=0.02,
    )
    time.sleep(0.3)  # anything more would be a duplicate
    enqueued = [i for m in broker for i in m]
    assert enqueued == ids, "each committed entry once, in commit order"
    assert relay.enqueued_total == 5


def test_entries_committed_before_the_relay_started_are_enqueued_at_once(
    staff, namespace, relay_mode, broker, relays
):
    ids = [write(staff, namespace, n) for n in range(3)]
    relays(poll_seconds=60)
    wait_for(
        lambda: [i for m in broker for i in m] == ids,
        timeout=10,
        what="the backlog to be enqueued",
        every=0.02,
    )


def test_one_relay_is_active_and_another_takes_over_when_it_stops(
    staff, namespace, relay_mode, broker, relays
):
    first = relays(poll_seconds=0.2)
    wait_for(first.active.is_set, timeout=10, what="the first relay to become active", every=0.02)
    second = relays(poll_seconds=0.2)
    time.sleep(1.0)
    assert not second.active.is_set(), "the advisory lock admits one relay"

    first.stop.set()
    first.thread.join(10)
    wait_for(second.active.is_set, timeout=10, what="the standby relay to take over", every=0.02)
    changeset_id = write(staff, namespace, 1)
    wait_for(
        lambda: [changeset_id] in broker,
        timeout=5,
        what="the new relay to enqueue the entry",
        every=0.02,
    )


def test_a_killed_relay_session_reconnects_and_catches_up(
    staff, namespace, relay_mode, broker, relays
):
    relay = relays(poll_seconds=0.2)
    wait_for(relay.active.is_set, timeout=10, what="the relay to become active", every=0.02)
    with connection.cursor() as cursor:  # what a server restart does to its session
        cursor.execute(  # the relay's session: the holder of the relay's advisory lock
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND pid <> pg_backend_pid()"
        )
        assert [row[0] for row in cursor.fetchall()] == [True]
    changeset_id = write(staff, namespace, 1)  # committed while the relay has no session
    wait_for(
        lambda: [changeset_id] in broker,
        timeout=10,
        what="the reconnected relay to enqueue it",
        every=0.02,
    )
    assert relay.thread.is_alive()


def test_a_broker_outage_is_retried_at_the_next_wake(
    staff, namespace, relay_mode, relays, monkeypatch, hooked
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
    wait_for(lambda: len(calls) >= 1, timeout=5, what="a failed attempt", every=0.02)
    up.set()
    wait_for(lambda: len(calls) >= 2, timeout=5, what="the retry", every=0.02)
    assert calls[-1] == [changeset_id]
    time.sleep(0.8)
    assert calls.count([changeset_id]) == 2, "once enqueued, not enqueued again"


def test_the_batch_task_publishes_each_entry_and_counts_outcomes(staff, namespace, relay_mode):
    ids = [write(staff, namespace, n) for n in range(3)]
    journal.journal_publish(changeset_id=ids[0])

    counts = journal_publish_batch(ids + ["0" * 32])

    assert counts == {"already_published": 1, "published": 2, "missing": 1}
    assert not JournalEntry.objects.exists()


# --- without hooks: the relay publishes itself -----------------------------------------------


def test_without_hooks_the_relay_publishes_each_entry_once_in_commit_order(
    staff, namespace, relay_mode, relays, monkeypatch
):
    sent: list[Any] = []
    monkeypatch.setattr(journal_publish_batch, "apply_async", lambda **kw: sent.append(kw))
    published: list[str] = []
    real_publish = journal.publish

    def publish(ids, **kw):
        outcomes = real_publish(ids, **kw)
        published.extend(str(i) for i, o in outcomes.items() if o == journal.PUBLISHED)
        return outcomes

    monkeypatch.setattr(journal, "publish", publish)
    relay = relays(poll_seconds=60)  # only the NOTIFY can wake it
    wait_for(relay.active.is_set, timeout=10, what="the relay to become active", every=0.02)
    ids = [write(staff, namespace, n) for n in range(5)]

    wait_for(
        lambda: not JournalEntry.objects.exists(),
        timeout=5,
        what="the relay to publish (delete) five entries",
        every=0.02,
    )
    time.sleep(0.3)  # anything more would be a second attempt
    assert published == ids, "each published once, in commit order"
    assert relay.published_total == 5
    assert (relay.enqueued_total, sent) == (0, []), "no Celery task without hooks"


def test_without_hooks_a_broker_outage_is_recorded_and_retried_at_the_next_wake(
    staff, namespace, relay_mode, relays, monkeypatch, settings
):
    from changesets.outbox.subscriptions import subscription_create

    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    subscription = subscription_create(actor=None, name="s", url="http://127.0.0.1:9/")
    calls: list[str] = []
    up = threading.Event()

    def enqueue_pump(subscription_id, countdown=None):
        calls.append(subscription_id)
        if not up.is_set():
            raise ConnectionError("broker unreachable")

    monkeypatch.setattr("changesets.outbox.pumps.enqueue_pump", enqueue_pump)
    relays(poll_seconds=0.3)
    changeset_id = write(staff, namespace, 1)
    wait_for(lambda: len(calls) >= 1, timeout=5, what="a failed attempt", every=0.02)
    wait_for(
        lambda: JournalEntry.objects.get(pk=changeset_id).failures == 1,
        timeout=5,
        what="the failure to be recorded",
        every=0.02,
    )
    left = JournalEntry.objects.get(pk=changeset_id)
    assert left.phase == JournalPhase.COMMITTED and "broker unreachable" in left.last_error

    failed = JournalEntry.objects.get(pk=changeset_id).failures  # one per wake while down
    up.set()
    wait_for(
        lambda: not JournalEntry.objects.filter(pk=changeset_id).exists(),
        timeout=5,
        what="the retry to publish (delete) it",
        every=0.02,
    )
    time.sleep(0.8)
    assert calls[-1] == str(subscription.id)
    assert JournalTally.objects.get().failures >= failed >= 1  # counted, though it is gone


def test_linger_is_short_after_a_quiet_spell_and_paced_under_a_stream():
    """``JournalRelay.linger``: the base linger after a pass that handed nothing over or
    ended long ago; under a stream, whatever is left of the stream linger since the
    last pass (never less than the base)."""
    relay = JournalRelay(linger_seconds=0.01, stream_linger_seconds=0.05)
    assert relay.linger(100.0) == 0.01  # no pass yet
    relay.last_pass = (100.0, 0)
    assert relay.linger(100.001) == 0.01  # the last pass found nothing: quiet
    relay.last_pass = (100.0, 3)
    assert relay.linger(100.002) == pytest.approx(0.048)  # streaming: until 50 ms after it
    assert relay.linger(100.045) == 0.01  # not less than the base linger
    assert relay.linger(100.2) == 0.01  # long ago: quiet again
    assert JournalRelay(linger_seconds=0.01, stream_linger_seconds=0).linger(100.001) == 0.01


def test_under_a_stream_of_commits_one_pass_takes_them_all(
    staff, namespace, relay_mode, relays, monkeypatch
):
    """Real commits and a real LISTEN: after a pass that published something, the
    commits that follow within the stream linger wait for one pass together instead
    of costing a pass each; the first commit after a quiet spell goes at once."""
    passes: list[int] = []
    real_publish = journal.publish

    def publish(ids, **kw):
        passes.append(len(ids))
        return real_publish(ids, **kw)

    monkeypatch.setattr(journal, "publish", publish)
    relay = relays(poll_seconds=60, linger_seconds=0, stream_linger_seconds=2.0)
    wait_for(relay.active.is_set, timeout=10, what="the relay to become active", every=0.02)
    started = time.monotonic()
    write(staff, namespace, 0)  # after a quiet spell: no linger
    wait_for(lambda: passes == [1], timeout=5, what="the first pass", every=0.01)
    assert time.monotonic() - started < 1.5, "a lone commit is not held for the stream linger"
    for n in range(1, 6):  # a stream: five commits well inside the 2 s stream linger
        write(staff, namespace, n)
    wait_for(lambda: not JournalEntry.objects.exists(), timeout=10, what="the stream published")
    assert passes == [1, 5], "the stream's five commits share one pass"
    assert relay.published_total == 6
