"""The push pump, in process: signed pages in order, cursor only on 2xx, backoff, claims.

The real-worker scenarios (SIGKILL, broker outage) are in test_delivery_worker.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from changesets.models import Revision, Rpc, Subscription
from changesets.ops import PutOp
from changesets.outbox import delivery, payloads, pumps
from changesets.outbox.subscriptions import subscription_create, subscription_lag
from changesets.selectors import feed
from changesets.services.apply import changeset_apply
from entities.store import baseline
from tests.changesets.helpers import key
from tests.entities.factories import NamespaceFactory

pytestmark = pytest.mark.django_db

NS = "acme.orders"


@pytest.fixture(autouse=True)
def webhook_settings(webhook_settings):
    return webhook_settings


def subscribe(url: str, **kw: Any) -> Subscription:
    return subscription_create(actor=None, name=kw.pop("name", "test"), url=url, **kw)


def commit_some(actor, n: int, *, ns: str = NS, width: int = 1, start: int = 0) -> list:
    made = []
    for i in range(start, start + n):
        ops = [PutOp(key(f"{ns}/order/o{i}-{j}"), {"i": i, "j": j}) for j in range(width)]
        made.append(
            changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE).changeset
        )
    return made


def all_event_ids(namespaces: list[str] | None = None) -> list[str]:
    qs = Revision.objects.filter(branch="").order_by("seq", "id")
    if namespaces:
        qs = qs.filter(namespace__in=namespaces)
    return [f"{r.changeset_id}:{r.namespace}/{r.kind}/{r.slug}" for r in qs]


def pump(subscription: Subscription, **kw: Any) -> str:
    return pumps.subscription_pump(subscription_id=str(subscription.id), **kw)


def refresh(subscription: Subscription) -> Subscription:
    subscription.refresh_from_db()
    return subscription


def due_now(subscription: Subscription) -> None:
    Subscription.objects.filter(pk=subscription.pk).update(next_attempt_at=timezone.now())


# --- a successful delivery -------------------------------------------------------------------


def test_a_page_is_posted_signed_and_the_cursor_advances(staff, namespace, receivers, no_wake):
    made = commit_some(staff, 3)
    sub = subscribe("placeholder", namespaces=[])
    receiver = receivers(secret=sub.secret)
    Subscription.objects.filter(pk=sub.pk).update(url=receiver.url)

    assert pump(sub) == "idle"

    [got] = receiver.deliveries
    assert got.signature_ok is True
    expected = "sha256=" + hmac.new(sub.secret.encode(), got.body, hashlib.sha256).hexdigest()
    assert got.signature == expected
    assert got.delivery_id and got.document["delivery_id"] == got.delivery_id
    assert got.document["subscription_id"] == str(sub.id)
    assert set(got.document) == {
        "subscription_id",
        "delivery_id",
        "records",
        "next_cursor",
        "watermark",
        "capture",
    }
    assert [r["event_id"] for r in got.records] == all_event_ids()
    sub = refresh(sub)
    assert sub.cursor_seq == made[-1].seq
    assert feed.cursor_decode(got.document["next_cursor"]) == sub.cursor_seq
    assert sub.last_delivery_at is not None and sub.last_error == ""
    assert (sub.deliveries_ok, sub.deliveries_failed) == (1, 0)
    assert subscription_lag(sub) == 0
    # Nothing new: the next run delivers nothing.
    assert pump(sub) == "idle"
    assert len(receiver.deliveries) == 1


def test_pumping_continues_while_pages_are_full(staff, namespace, receivers, settings, no_wake):
    settings.ATLAS_WEBHOOK_PAGE_SIZE = 2
    commit_some(staff, 7)
    receiver = receivers()
    sub = subscribe(receiver.url)

    assert pump(sub) == "idle"

    assert [len(d.records) for d in receiver.deliveries] == [2, 2, 2, 1]
    assert [r["event_id"] for d in receiver.deliveries for r in d.records] == all_event_ids()
    assert refresh(sub).deliveries_ok == 4


def test_a_run_yields_after_its_page_budget_and_queues_the_rest(
    staff, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_PAGE_SIZE = 1
    commit_some(staff, 5)
    receiver = receivers()
    sub = subscribe(receiver.url)

    assert pump(sub, max_pages=2) == "yielded"

    assert len(receiver.deliveries) == 2
    assert no_wake == [(str(sub.id), None)]  # the rest is queued, not dropped


def test_a_changeset_over_the_page_size_goes_in_parts_never_mixed_with_another(
    staff, namespace, receivers, settings, no_wake
):
    # Old rule: a page never split a changeset ([3, 3, 3] here). Now a delivery is
    # bounded by the record count too: a bigger changeset goes in parts.
    settings.ATLAS_WEBHOOK_PAGE_SIZE = 2
    commit_some(staff, 3, width=3)
    receiver = receivers()
    sub = subscribe(receiver.url)

    pump(sub)

    assert [len(d.records) for d in receiver.deliveries] == [2, 1, 2, 1, 2, 1]
    assert [(d.document["part"], d.document["parts"]) for d in receiver.deliveries] == [
        (1, 2),
        (2, 2),
    ] * 3
    for d in receiver.deliveries:
        assert len({r["changeset_id"] for r in d.records}) == 1
    assert [r["event_id"] for d in receiver.deliveries for r in d.records] == all_event_ids()


def test_namespaces_and_capture_are_honoured(staff, namespace, receivers, no_wake):
    NamespaceFactory(name="acme.billing")
    commit_some(staff, 2)
    commit_some(staff, 2, ns="acme.billing")
    receiver = receivers()
    sub = subscribe(receiver.url, namespaces=["acme.billing"], capture="new_row")

    pump(sub)

    records = [r for d in receiver.deliveries for r in d.records]
    assert {r["namespace"] for r in records} == {"acme.billing"}
    assert [r["event_id"] for r in records] == all_event_ids(["acme.billing"])
    assert all("new_row" in r and "new_values" not in r for r in records)
    assert receiver.deliveries[0].document["capture"] == "new_row"
    assert subscription_lag(refresh(sub)) == 0


def test_start_now_skips_history(staff, namespace, receivers, no_wake):
    commit_some(staff, 3)
    receiver = receivers()
    sub = subscribe(receiver.url, start="now")
    assert pump(sub) == "idle"
    assert receiver.deliveries == []
    later = commit_some(staff, 1, start=10)
    pump(sub)
    assert [r["changeset_id"] for r in receiver.deliveries[0].records] == [str(later[0].id)]


# --- failures and backoff --------------------------------------------------------------------


def test_a_non_2xx_leaves_the_cursor_and_backs_off(staff, namespace, receivers, no_wake):
    commit_some(staff, 2)
    receiver = receivers(respond=lambda n, d: 503)
    sub = subscribe(receiver.url)
    before = timezone.now()

    assert pump(sub) == "failed"

    sub = refresh(sub)
    assert sub.cursor_seq == 0
    assert "HTTP 503" in sub.last_error
    assert sub.consecutive_failures == 1
    assert (sub.deliveries_ok, sub.deliveries_failed) == (0, 1)
    # base 1 s, first failure: between 0.5 and 1 s from now.
    wait = (sub.next_attempt_at - before).total_seconds()
    assert 0.45 <= wait <= 1.5
    [(sid, countdown)] = no_wake
    assert sid == str(sub.id) and 0.5 <= countdown <= 1.0
    # Until then, a wake-up does nothing.
    assert pump(sub) == "backoff"
    assert len(receiver.deliveries) == 1


def test_a_receiver_failing_n_times_then_succeeding_gets_every_page_in_order(
    staff, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_PAGE_SIZE = 2
    commit_some(staff, 5)
    failures = {0, 1, 2, 4}  # the first page fails 3 times, the second once
    receiver = receivers(respond=lambda n, d: 500 if n in failures else 200)
    sub = subscribe(receiver.url)

    outcomes = []
    for _ in range(10):
        outcomes.append(pump(sub))
        if outcomes[-1] == "idle":
            break
        due_now(sub)

    assert outcomes == ["failed", "failed", "failed", "failed", "idle"]
    # Each retry re-sends the same page, with the same delivery id.
    ids = [d.delivery_id for d in receiver.deliveries]
    assert ids[0] == ids[1] == ids[2] == ids[3] != ids[4] == ids[5]
    accepted = receiver.accepted()
    assert [r["event_id"] for d in accepted for r in d.records] == all_event_ids()
    sub = refresh(sub)
    assert sub.consecutive_failures == 0 and sub.last_error == ""
    assert (sub.deliveries_ok, sub.deliveries_failed) == (3, 4)


def test_backoff_grows_exponentially_with_jitter_and_a_cap(settings):
    settings.ATLAS_WEBHOOK_BACKOFF_BASE_SECONDS = 2
    settings.ATLAS_WEBHOOK_BACKOFF_MAX_SECONDS = 60
    for failures, nominal in [(1, 2), (2, 4), (3, 8), (5, 32), (6, 60), (30, 60)]:
        samples = [delivery.backoff_seconds(failures) for _ in range(200)]
        assert all(nominal / 2 <= s <= nominal for s in samples), failures
        assert len(set(samples)) > 1  # jittered


def test_timeouts_and_refused_connections_are_failures(
    staff, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_TIMEOUT_SECONDS = 0.3
    commit_some(staff, 1)
    slow = receivers(delay=1.5)
    sub = subscribe(slow.url)
    started = time.monotonic()
    assert pump(sub) == "failed"
    assert time.monotonic() - started < 1.4
    assert "timed out" in refresh(sub).last_error.lower()

    closed = receivers()
    url = closed.url
    closed.close()
    other = subscribe(url)
    assert pump(other) == "failed"
    assert "refused" in refresh(other).last_error.lower()


def test_redirects_are_not_followed(staff, namespace, receivers, no_wake):
    commit_some(staff, 1)
    receiver = receivers(respond=lambda n, d: 307)
    sub = subscribe(receiver.url)
    assert pump(sub) == "failed"
    assert "HTTP 307" in refresh(sub).last_error
    assert len(receiver.deliveries) == 1


def test_private_addresses_are_refused_at_delivery_time_too(
    staff, namespace, receivers, settings, no_wake
):
    commit_some(staff, 1)
    receiver = receivers()
    sub = subscribe(receiver.url)
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = False

    assert pump(sub) == "failed"

    assert receiver.deliveries == []
    assert "non-public" in refresh(sub).last_error


def test_inactive_subscriptions_are_not_delivered(staff, namespace, receivers, no_wake):
    commit_some(staff, 1)
    receiver = receivers()
    sub = subscribe(receiver.url, active=False)
    assert pump(sub) == "inactive"
    assert receiver.deliveries == []
    assert pumps.subscription_pump(subscription_id="0" * 8 + "-0000-0000-0000-" + "0" * 12) == (
        "missing"
    )


# --- waking pumps ----------------------------------------------------------------------------


def test_wake_pumps_picks_due_subscriptions_whose_namespaces_intersect(
    staff, namespace, receivers, no_wake
):
    NamespaceFactory(name="acme.billing")
    every = subscribe("http://127.0.0.1:9/a")
    orders = subscribe("http://127.0.0.1:9/b", namespaces=[NS])
    billing = subscribe("http://127.0.0.1:9/c", namespaces=["acme.billing"])
    subscribe("http://127.0.0.1:9/d", active=False)
    backing_off = subscribe("http://127.0.0.1:9/e", namespaces=[NS])
    Subscription.objects.filter(pk=backing_off.pk).update(
        next_attempt_at=timezone.now() + timedelta(minutes=5)
    )

    assert pumps.wake_pumps(namespaces=[NS]) == 2

    assert sorted(sid for sid, _ in no_wake) == sorted([str(every.id), str(orders.id)])
    no_wake.clear()
    pumps.wake_pumps(namespaces=["acme.billing", NS])
    assert len(no_wake) == 3 and str(billing.id) in {sid for sid, _ in no_wake}


def test_the_beat_wakes_only_due_subscriptions_with_something_to_deliver(
    staff, namespace, receivers, no_wake
):
    NamespaceFactory(name="acme.billing")
    commit_some(staff, 1)
    pending = subscribe("http://127.0.0.1:9/a", namespaces=[NS])
    subscribe("http://127.0.0.1:9/b", namespaces=["acme.billing"])  # nothing there
    caught_up = subscribe("http://127.0.0.1:9/c", start="now")
    assert caught_up.cursor_seq > 0

    assert pumps.wake_due_subscriptions() == 1
    assert no_wake == [(str(pending.id), None)]


def test_a_changeset_landing_while_the_pump_holds_the_row_is_not_left_behind(
    staff, namespace, receivers, no_wake, monkeypatch
):
    """The wake for it found the row busy and left; the pump looks again after releasing."""
    commit_some(staff, 1)
    receiver = receivers()
    sub = subscribe(receiver.url)
    real_step = delivery.deliver_next_page
    landed = []

    def step(subscription_id: str):
        result = real_step(subscription_id)
        if result.outcome == "idle" and not landed:
            landed.extend(commit_some(staff, 1, start=50))
        return result

    monkeypatch.setattr(delivery, "deliver_next_page", step)

    assert pump(sub) == "idle"

    assert [r["event_id"] for d in receiver.deliveries for r in d.records] == all_event_ids()
    assert len(receiver.deliveries) == 2


# --- one deliverer per subscription -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_pumps_never_deliver_one_subscription_at_once(
    staff, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_PAGE_SIZE = 1
    commit_some(staff, 6)
    receiver = receivers(delay=0.05)
    sub = subscribe(receiver.url)
    outcomes: list[str] = []

    def run() -> None:
        try:
            outcomes.append(pump(sub))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert receiver.max_in_flight == 1
    delivered = [r["event_id"] for d in receiver.deliveries for r in d.records]
    assert delivered == all_event_ids()  # each page once, in order
    assert "idle" in outcomes
    assert set(outcomes) <= {"idle", "busy"}


def test_delivery_ids_are_stable_for_the_same_page(staff, namespace, no_wake):
    commit_some(staff, 2)
    sub = subscribe("http://127.0.0.1:9/a")
    page = feed.feed_page(after_seq=0, namespaces=None)
    again = feed.feed_page(after_seq=0, namespaces=None)
    assert payloads.delivery_id(sub, page) == payloads.delivery_id(sub, again)
    body = json.loads(payloads.page_body(sub, page, "x"))
    assert body["records"] == page.records
