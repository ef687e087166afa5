"""Under load, deliveries and pump wake-ups coalesce (ATLAS_WEBHOOK_COALESCE_MS); a quiet
subscription is not delayed. Both keep "nothing committed is left without a wake"."""

from __future__ import annotations

import time
from typing import Any

import pytest

from changesets.models import Rpc, Subscription
from changesets.ops import PutOp
from changesets.outbox import delivery, pumps
from changesets.outbox.relay import WakeThrottle
from changesets.outbox.subscriptions import subscription_create
from changesets.services.apply import changeset_apply
from entities.store import baseline
from tests.changesets.helpers import key

pytestmark = pytest.mark.django_db

NS = "acme.orders"


@pytest.fixture(autouse=True)
def webhook_settings(webhook_settings):
    return webhook_settings


def commit(actor: Any, i: int) -> None:
    ops = [PutOp(key(f"{NS}/order/o{i}"), {"i": i})]
    changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.PUT_ENTITY)


def pump_with_a_commit_landing_mid_delivery(
    staff: Any, receivers: Any, monkeypatch: Any
) -> tuple[str, list[float]]:
    """Pump one changeset; while it is being delivered another commits. The start
    time of each delivery, as the receiver saw it."""
    commit(staff, 0)
    receiver = receivers()
    sub: Subscription = subscription_create(actor=None, name="c", url=receiver.url)
    real_step = delivery.deliver_next_page
    began: list[float] = []

    def step(subscription_id: str) -> delivery.StepResult:
        began.append(time.monotonic())
        result = real_step(subscription_id)
        if result.outcome == "delivered" and len(began) == 1:
            commit(staff, 1)  # landed while the first delivery was in flight
        return result

    monkeypatch.setattr(delivery, "deliver_next_page", step)
    outcome = pumps.subscription_pump(subscription_id=str(sub.id))
    assert len(receiver.deliveries) == 2, "both changesets delivered, in two deliveries"
    return outcome, began


def test_a_commit_landing_during_a_delivery_waits_for_the_coalesce_interval(
    staff, namespace, receivers, no_wake, monkeypatch, settings
):
    settings.ATLAS_WEBHOOK_COALESCE_MS = 400

    outcome, began = pump_with_a_commit_landing_mid_delivery(staff, receivers, monkeypatch)

    assert outcome == "idle"
    assert began[1] - began[0] >= 0.4


def test_without_coalescing_the_next_delivery_goes_at_once(
    staff, namespace, receivers, no_wake, monkeypatch, settings
):
    settings.ATLAS_WEBHOOK_COALESCE_MS = 0

    _, began = pump_with_a_commit_landing_mid_delivery(staff, receivers, monkeypatch)

    assert began[1] - began[0] < 0.4


def test_a_quiet_subscription_is_not_delayed(staff, namespace, receivers, no_wake, settings):
    settings.ATLAS_WEBHOOK_COALESCE_MS = 2000
    commit(staff, 0)
    receiver = receivers()
    sub = subscription_create(actor=None, name="q", url=receiver.url)

    started = time.monotonic()
    assert pumps.subscription_pump(subscription_id=str(sub.id)) == "idle"

    assert time.monotonic() - started < 1.5
    assert len(receiver.deliveries) == 1


# --- the relay's wake throttle ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_the_throttle_sends_the_first_wake_at_once_and_holds_the_next(clock, no_wake):
    throttle = WakeThrottle(0.1, clock=clock)

    throttle.wake(["a", "b"])
    clock.now += 0.03
    throttle.wake(["a"])
    throttle.wake(["a"])  # still one held wake, not two

    assert [sid for sid, _ in no_wake] == ["a", "b"]
    assert throttle.next_due() == pytest.approx(1000.1)
    throttle.flush()  # not due yet
    assert len(no_wake) == 2

    clock.now += 0.08
    throttle.flush()
    assert [sid for sid, _ in no_wake] == ["a", "b", "a"], "the held wake goes when due"
    assert throttle.next_due() is None


def test_a_held_wake_the_broker_refuses_stays_held(clock, monkeypatch):
    sent: list[str] = []
    down = [True]

    def enqueue(subscription_id: str, countdown: float | None = None) -> None:
        if down[0]:
            raise ConnectionError("broker unreachable")
        sent.append(subscription_id)

    monkeypatch.setattr(pumps, "enqueue_pump", enqueue)
    throttle = WakeThrottle(0.1, clock=clock)
    down[0] = False
    throttle.wake(["a"])
    clock.now += 0.01
    throttle.wake(["a"])  # held
    down[0] = True
    clock.now += 0.2

    throttle.flush()
    assert throttle.next_due() is not None, "kept for the next flush"

    down[0] = False
    throttle.flush()
    assert sent == ["a", "a"] and throttle.next_due() is None


def test_a_refused_leading_wake_raises_so_the_entries_stay_outstanding(clock, monkeypatch):
    def enqueue(subscription_id: str, countdown: float | None = None) -> None:
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(pumps, "enqueue_pump", enqueue)
    throttle = WakeThrottle(0.1, clock=clock)

    with pytest.raises(ConnectionError):
        throttle.wake(["a"])
    assert throttle.next_due() is None


@pytest.mark.django_db(transaction=True)
def test_a_pump_woken_while_another_coalesces_finds_the_row_busy(
    staff, namespace, receivers, no_wake, monkeypatch, settings
):
    import threading

    from django.db import connection

    settings.ATLAS_WEBHOOK_COALESCE_MS = 1500
    commit(staff, 0)
    receiver = receivers()
    sub = subscription_create(actor=None, name="c", url=receiver.url)
    real_step = delivery.deliver_next_page
    coalescing = threading.Event()

    def step(subscription_id: str) -> delivery.StepResult:
        result = real_step(subscription_id)
        if result.outcome == "delivered" and not coalescing.is_set():
            commit(staff, 1)
            coalescing.set()  # the pump is about to wait for more
        return result

    monkeypatch.setattr(delivery, "deliver_next_page", step)
    outcome: list[str] = []

    def run() -> None:
        try:
            outcome.append(pumps.subscription_pump(subscription_id=str(sub.id)))
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert coalescing.wait(10)
    time.sleep(0.3)  # well inside the 1.5 s wait

    assert real_step(str(sub.id)).outcome == "busy"
    thread.join(10)
    assert outcome == ["idle"]
    assert len(receiver.deliveries) == 2
