"""Push delivery and the journal with a real broker and real ``celery worker`` processes.

Each test commits for real (``transaction=True``) in this process, which
publishes to the broker on a queue of its own; workers run as subprocesses
on the same test database. Without a reachable Redis (or a ``redis://`` /
``amqp://`` ``CELERY_BROKER_URL``) these tests skip, saying so.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from changesets.models import JournalEntry, JournalPhase, Revision, Rpc, Subscription
from changesets.ops import PutOp
from changesets.outbox.subscriptions import subscription_create, subscription_lag
from changesets.services.apply import changeset_apply
from entities.store import baseline
from tests.changesets.helpers import key
from tests.changesets.worker_helpers import (
    Broker,
    celery_configured,
    real_broker,
    wait_for,
    worker_factory,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NS = "acme.orders"
CLOSED_BROKER = "redis://127.0.0.1:1/0"


@pytest.fixture
def broker() -> Iterator[Broker]:
    with real_broker() as b:
        yield b


@pytest.fixture
def start_worker(broker):
    with worker_factory(broker) as start:
        yield start


@pytest.fixture(autouse=True)
def private_webhooks(settings):
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True


def commit_some(actor, n: int, *, width: int = 1, start: int = 0) -> list:
    made = []
    for i in range(start, start + n):
        ops = [PutOp(key(f"{NS}/order/o{i}-{j}"), {"i": i, "j": j}) for j in range(width)]
        result = changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE)
        made.append(result.changeset)
    return made


def all_event_ids() -> list[str]:
    return [
        f"{r.changeset_id}:{r.namespace}/{r.kind}/{r.slug}"
        for r in Revision.objects.filter(branch="").order_by("seq", "id")
    ]


def outstanding() -> int:
    return JournalEntry.objects.filter(phase=JournalPhase.COMMITTED).count()


def caught_up(subscription: Subscription) -> bool:
    subscription.refresh_from_db()
    return subscription_lag(subscription) == 0


def test_sigkill_mid_delivery_loses_nothing(staff, namespace, start_worker, receivers):
    """A worker killed while a delivery is in flight: after a restart every record
    arrives at least once, and a receiver de-duplicating by event_id holds exactly
    the full set."""
    held_once: list[int] = []

    def hold(n, delivery):  # park the first delivery so the kill lands mid-request
        if not held_once:
            held_once.append(n)
            return True
        return False

    receiver = receivers(hold=hold)
    sub = subscription_create(actor=None, name="crash", url=receiver.url)
    receiver.secret = sub.secret
    first = start_worker(ATLAS_WEBHOOK_PAGE_SIZE="4")

    commit_some(staff, 12, width=2)
    wait_for(receiver.held.is_set, timeout=20, what="a delivery in flight")
    first.kill()  # SIGKILL the worker and its pool children mid-delivery
    receiver.release()  # the receiver did get that page; its 200 goes nowhere
    sub.refresh_from_db()
    assert sub.cursor_seq == 0, "the cursor must not move without a 2xx"
    in_flight = receiver.deliveries[0]

    start_worker(ATLAS_WEBHOOK_PAGE_SIZE="4")  # the beat's wake-up sweep resumes the pump
    wait_for(lambda: caught_up(sub), timeout=30, what="the subscription to catch up")
    wait_for(lambda: outstanding() == 0, timeout=30, what="the journal to be published")

    expected = all_event_ids()
    assert len(expected) == 24
    assert receiver.event_ids() == set(expected)  # exactly the full set after de-duplication
    later = {r["event_id"] for d in receiver.deliveries[1:] for r in d.records}
    assert in_flight.records and {r["event_id"] for r in in_flight.records} <= later, (
        "the page in flight at the kill is delivered again (at-least-once)"
    )
    assert all(d.signature_ok for d in receiver.deliveries)
    # In seq order: each delivery after the kill starts where the previous one ended.
    seqs = [r["seq"] for d in receiver.deliveries[1:] for r in d.records]
    assert seqs == sorted(seqs)


def test_broker_down_during_writes_then_the_sweep_publishes_everything(
    staff, namespace, broker, start_worker, receivers
):
    receiver = receivers()
    with celery_configured(broker_url=CLOSED_BROKER):
        sub = subscription_create(actor=None, name="outage", url=receiver.url)
        started = time.monotonic()
        made = commit_some(staff, 6)  # writes succeed; their journal tasks cannot be queued
        write_seconds = time.monotonic() - started

        assert len(made) == 6 and all(c is not None for c in made)
        assert outstanding() == 6
        out = io.StringIO()
        call_command("recover_batches", "--report-only", "--no-progress", stdout=out)
        report = out.getvalue()
        assert "6 outstanding journal entries" in report
        for changeset in made:
            assert str(changeset.id) in report
        # Finishing them now cannot wake the pumps: non-zero exit, entries kept.
        with pytest.raises(CommandError, match="could not be finished"):
            call_command(
                "recover_batches", "--no-progress", "--wait=0", "--limit=2", stdout=io.StringIO()
            )
        assert outstanding() == 6
        tried = JournalEntry.objects.filter(attempts=1)
        assert tried.count() == 2 and all("wake pumps" in e.last_error for e in tried)

    # The broker is back: a worker's beat sweep publishes the backlog and the pump delivers.
    start_worker()
    wait_for(lambda: outstanding() == 0, timeout=30, what="the sweep to publish the backlog")
    wait_for(lambda: caught_up(sub), timeout=30, what="the subscription to catch up")
    assert receiver.event_ids() == set(all_event_ids())
    assert write_seconds < 20


def test_a_failing_receiver_retries_in_order_and_never_blocks_the_others(
    staff, namespace, start_worker, receivers
):
    flaky = receivers(respond=lambda n, d: 500 if n < 3 else 200)
    healthy = receivers()
    dead = receivers(respond=lambda n, d: 503)
    subs = {
        name: subscription_create(actor=None, name=name, url=r.url)
        for name, r in (("flaky", flaky), ("healthy", healthy), ("dead", dead))
    }
    start_worker(ATLAS_WEBHOOK_PAGE_SIZE="3")

    commit_some(staff, 9)

    wait_for(lambda: caught_up(subs["healthy"]), timeout=20, what="the healthy subscription")
    wait_for(lambda: caught_up(subs["flaky"]), timeout=30, what="the flaky subscription")
    expected = all_event_ids()
    for receiver in (healthy, flaky):
        accepted = [r["event_id"] for d in receiver.accepted() for r in d.records]
        assert accepted == expected  # every page, in order, none twice once accepted
    # Each retry starts again at the cursor: the failed pages and the first accepted
    # one all begin with the first record.
    assert [d.records[0]["event_id"] for d in flaky.deliveries[:4]] == [expected[0]] * 4
    assert [d.status for d in flaky.deliveries[:4]] == [500, 500, 500, 200]
    dead_sub = Subscription.objects.get(pk=subs["dead"].pk)
    assert dead_sub.cursor_seq == 0
    assert dead_sub.consecutive_failures >= 1 and "HTTP 503" in dead_sub.last_error
    assert dead_sub.next_attempt_at is not None
    flaky_sub = Subscription.objects.get(pk=subs["flaky"].pk)
    assert flaky_sub.deliveries_failed == 3 and flaky_sub.last_error == ""
