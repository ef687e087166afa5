"""Webhook hardening, in process with a real HTTP receiver: Standard Webhooks signatures
and secret rotation, deliveries bounded by bytes and records (parts), parking after
too many failures with retry and skip, the parked metric, and the IPv6 SSRF rule at
delivery time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import socket
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from standardwebhooks import Webhook, WebhookVerificationError

from changesets.models import Rpc, Subscription
from changesets.ops import PutOp
from changesets.outbox import payloads, pumps, webhooks
from changesets.outbox.subscriptions import (
    subscription_create,
    subscription_retry,
    subscription_rotate_secret,
    subscription_skip,
)
from changesets.selectors import feed
from changesets.services.apply import changeset_apply
from entities.store import baseline
from tests.changesets.helpers import key
from tests.changesets.worker_helpers import Delivery
from tests.entities.factories import UserFactory

pytestmark = pytest.mark.django_db

NS = "acme.orders"


@pytest.fixture(autouse=True)
def webhook_settings(webhook_settings):
    settings = webhook_settings
    settings.ATLAS_WEBHOOK_MAX_BODY_BYTES = 1024 * 1024
    settings.ATLAS_WEBHOOK_MAX_ATTEMPTS = 20
    return settings


@pytest.fixture
def root(db):
    return UserFactory(username="root", is_superuser=True, is_staff=True)


def subscribe(url: str, **kw: Any) -> Subscription:
    return subscription_create(actor=None, name=kw.pop("name", "test"), url=url, **kw)


def commit(actor, n: int = 1, *, width: int = 1, blob: int = 0, start: int = 0) -> list:
    made = []
    for i in range(start, start + n):
        ops = [
            PutOp(key(f"{NS}/order/o{i}-{j}"), {"i": i, "j": j, "blob": "x" * blob})
            for j in range(width)
        ]
        made.append(
            changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE).changeset
        )
    return made


def pump(subscription: Subscription, **kw: Any) -> str:
    return pumps.subscription_pump(subscription_id=str(subscription.id), **kw)


def pump_until_settled(subscription: Subscription, rounds: int = 100) -> list[str]:
    """Pump, skipping the backoff each time, until it is idle or parked."""
    outcomes = []
    for _ in range(rounds):
        Subscription.objects.filter(pk=subscription.pk, next_attempt_at__isnull=False).update(
            next_attempt_at=timezone.now()
        )
        outcomes.append(pump(subscription))
        if outcomes[-1] in ("idle", "parked"):
            return outcomes
    raise AssertionError(f"never settled: {outcomes}")


def refresh(subscription: Subscription) -> Subscription:
    subscription.refresh_from_db()
    return subscription


def event_ids(deliveries: list[Delivery]) -> list[str]:
    return [r["event_id"] for d in deliveries for r in d.records]


def changeset_ids(d: Delivery) -> set[str]:
    return {r["changeset_id"] for r in d.records}


def verify(secret: str | bytes, d: Delivery) -> Any:
    return Webhook(secret).verify(d.body, d.headers)


# --- Standard Webhooks signatures ------------------------------------------------------------


def test_deliveries_are_signed_the_standard_webhooks_way_and_keep_the_old_header(
    staff, namespace, receivers, no_wake
):
    commit(staff, 2)
    receiver = receivers()
    sub = subscribe(receiver.url)
    assert sub.secret.startswith("whsec_")
    assert len(base64.b64decode(sub.secret.removeprefix("whsec_"))) == 32
    before = int(time.time())

    assert pump(sub) == "idle"

    [got] = receiver.deliveries
    h = got.headers
    assert h["webhook-id"] == h["x-atlas-delivery"] == got.document["delivery_id"]
    assert before - 1 <= int(h["webhook-timestamp"]) <= time.time() + 1
    assert re.fullmatch(r"v1,[A-Za-z0-9+/]+=*", h["webhook-signature"])
    # A receiver using the standardwebhooks library with the secret as issued.
    assert verify(sub.secret, got)["records"] == got.records
    # By hand: base64 HMAC-SHA256 of "<id>.<timestamp>.<body>" keyed by the decoded secret.
    key_bytes = base64.b64decode(sub.secret.removeprefix("whsec_"))
    signed = f"{h['webhook-id']}.{h['webhook-timestamp']}.".encode() + got.body
    mac = hmac.new(key_bytes, signed, hashlib.sha256).digest()
    assert h["webhook-signature"] == "v1," + base64.b64encode(mac).decode()
    # The deprecated header is still there, keyed by the secret string as before.
    old = "sha256=" + hmac.new(sub.secret.encode(), got.body, hashlib.sha256).hexdigest()
    assert h["x-atlas-signature"] == old
    # Tampering is caught.
    tampered = Delivery(got.delivery_id, got.signature, got.body + b" ", got.document)
    tampered.headers = h
    with pytest.raises(WebhookVerificationError):
        verify(sub.secret, tampered)


def test_a_retry_is_signed_afresh_with_the_same_webhook_id(staff, namespace, receivers, no_wake):
    commit(staff, 1)
    receiver = receivers(respond=lambda n, d: 500 if n == 0 else 200)
    sub = subscribe(receiver.url)

    assert pump_until_settled(sub) == ["failed", "idle"]

    first, second = receiver.deliveries
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    verify(sub.secret, first)
    verify(sub.secret, second)


def test_a_secret_from_before_whsec_keeps_working_as_its_own_bytes(
    staff, namespace, receivers, no_wake
):
    commit(staff, 1)
    receiver = receivers()
    sub = subscribe(receiver.url)
    legacy = "0123456789abcdef" * 4  # what secrets.token_hex(32) issued before
    Subscription.objects.filter(pk=sub.pk).update(secret=legacy)

    pump(sub)

    [got] = receiver.deliveries
    assert got.headers["x-atlas-signature"] == (
        "sha256=" + hmac.new(legacy.encode(), got.body, hashlib.sha256).hexdigest()
    )
    verify(legacy.encode(), got)
    verify("whsec_" + base64.b64encode(legacy.encode()).decode(), got)


# --- secret rotation -----------------------------------------------------------------------------


def test_after_rotation_both_secrets_sign_until_the_overlap_ends(
    staff, root, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_SECRET_OVERLAP_SECONDS = 3600
    receiver = receivers()
    sub = subscribe(receiver.url)
    old_secret = sub.secret

    rotated = subscription_rotate_secret(subscription_id=sub.id, actor=root)

    assert rotated.secret.startswith("whsec_") and rotated.secret != old_secret
    assert rotated.previous_secret == old_secret
    overlap = (rotated.previous_secret_expires_at - timezone.now()).total_seconds()
    assert 3590 <= overlap <= 3600
    commit(staff, 1)
    pump(sub)
    during = receiver.deliveries[-1]
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    verify(old_secret, during)  # a receiver not switched yet
    verify(rotated.secret, during)  # a receiver already switched
    # The deprecated header follows the new secret only.
    assert during.headers["x-atlas-signature"] == (
        "sha256=" + hmac.new(rotated.secret.encode(), during.body, hashlib.sha256).hexdigest()
    )

    Subscription.objects.filter(pk=sub.pk).update(
        previous_secret_expires_at=timezone.now() - timedelta(seconds=1)
    )
    commit(staff, 1, start=5)
    pump(sub)
    after = receiver.deliveries[-1]
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    verify(rotated.secret, after)
    with pytest.raises(WebhookVerificationError):
        verify(old_secret, after)


def test_rotating_twice_keeps_only_the_secret_just_replaced(root, namespace, no_wake):
    sub = subscribe("http://127.0.0.1:9/a")
    first = sub.secret
    second = subscription_rotate_secret(subscription_id=sub.id, actor=root).secret
    third = subscription_rotate_secret(subscription_id=sub.id, actor=root)
    assert third.previous_secret == second
    assert first not in webhooks.signing_secrets(third, now=timezone.now())
    assert webhooks.signing_secrets(third, now=timezone.now()) == [third.secret, second]


# --- bounded deliveries: bytes, records, parts ---------------------------------------------------


def test_a_changeset_over_the_body_limit_goes_in_signed_parts_in_order(
    staff, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_MAX_BODY_BYTES = 8000
    [big] = commit(staff, 1, width=5, blob=3000)
    [after] = commit(staff, 1, start=10)
    receiver = receivers()
    sub = subscribe(receiver.url)

    assert pump(sub) == "idle"

    parts, last = receiver.deliveries[:-1], receiver.deliveries[-1]
    assert [(d.document["part"], d.document["parts"]) for d in parts] == [(1, 3), (2, 3), (3, 3)]
    assert [len(d.records) for d in parts] == [2, 2, 1]
    assert all(len(d.body) <= 8000 for d in receiver.deliveries)
    assert all(changeset_ids(d) == {str(big.id)} for d in parts)
    assert len({d.headers["webhook-id"] for d in parts}) == 3  # one id per part
    for d in parts:
        verify(sub.secret, d)
    # Only the last part carries the cursor past the changeset.
    cursors = [feed.cursor_decode(d.document["next_cursor"]) for d in parts]
    assert cursors == [0, 0, big.seq]
    # The next changeset is an ordinary delivery: no part fields.
    assert changeset_ids(last) == {str(after.id)} and "part" not in last.document
    assert event_ids(receiver.deliveries) == event_ids(parts) + event_ids([last])
    assert refresh(sub).cursor_seq == after.seq


def test_the_cursor_passes_a_changeset_only_when_all_its_parts_are_delivered(
    staff, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_MAX_BODY_BYTES = 8000
    [big] = commit(staff, 1, width=5, blob=3000)
    receiver = receivers(respond=lambda n, d: 503 if n in (1, 2) else 200)  # part 2 fails twice
    sub = subscribe(receiver.url)

    assert pump(sub) == "failed"
    sub = refresh(sub)
    assert sub.cursor_seq == 0
    assert (sub.part_seq, sub.part_offset, sub.parts_done) == (big.seq, 2, 1)

    assert pump_until_settled(sub) == ["failed", "idle"]

    got = [(d.document["part"], d.headers["webhook-id"]) for d in receiver.deliveries]
    assert [p for p, _ in got] == [1, 2, 2, 2, 3]
    assert got[1][1] == got[2][1] == got[3][1]  # a retried part keeps its id
    assert event_ids(receiver.accepted()) == [f"{big.id}:{NS}/order/o0-{j}" for j in range(5)]
    sub = refresh(sub)
    assert sub.cursor_seq == big.seq and sub.part_seq is None


def test_small_changesets_are_cut_at_the_body_limit_without_splitting_any(
    staff, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_MAX_BODY_BYTES = 8000
    made = commit(staff, 6, blob=2000)
    receiver = receivers()
    sub = subscribe(receiver.url)

    pump(sub)

    assert all(len(d.body) <= 8000 for d in receiver.deliveries)
    assert len(receiver.deliveries) > 1
    assert all("part" not in d.document for d in receiver.deliveries)
    assert [r["changeset_id"] for d in receiver.deliveries for r in d.records] == [
        str(c.id) for c in made
    ]


def test_a_record_alone_over_the_body_limit_parks_at_once_and_retry_delivers_it_later(
    staff, root, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_MAX_BODY_BYTES = 4000
    [huge] = commit(staff, 1, blob=5000)
    receiver = receivers()
    sub = subscribe(receiver.url)

    assert pump(sub) == "parked"

    assert receiver.deliveries == []
    sub = refresh(sub)
    assert sub.parked_seq == huge.seq and sub.parked_attempts == 0
    assert "ATLAS_WEBHOOK_MAX_BODY_BYTES" in sub.parked_error
    assert f"{huge.id}:{NS}/order/o0-0" in sub.parked_error

    settings.ATLAS_WEBHOOK_MAX_BODY_BYTES = 64 * 1024
    subscription_retry(subscription_id=sub.id, actor=root)
    assert pump(sub) == "idle"
    assert [changeset_ids(d) for d in receiver.deliveries] == [{str(huge.id)}]


# --- parking, retry, skip ------------------------------------------------------------------------


def test_a_delivery_failing_max_attempts_times_parks_and_waits_for_an_operator(
    staff, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_MAX_ATTEMPTS = 3
    [only] = commit(staff, 1)
    receiver = receivers(respond=lambda n, d: 500)
    sub = subscribe(receiver.url)

    assert pump_until_settled(sub) == ["failed", "failed", "parked"]

    sub = refresh(sub)
    assert (sub.parked_seq, sub.parked_part, sub.parked_attempts) == (only.seq, None, 3)
    assert "HTTP 500" in sub.parked_error and sub.parked_at is not None
    assert sub.cursor_seq == 0
    # Nothing moves it on by itself: no retry is scheduled, pumps and wake-ups leave it.
    no_wake.clear()
    assert pump(sub) == "parked"
    assert pumps.wake_pumps(namespaces=[NS]) == 0
    assert pumps.wake_due_subscriptions() == 0
    assert no_wake == []
    assert len(receiver.deliveries) == 3


def test_retry_attempts_the_parked_delivery_again(
    staff, root, namespace, receivers, settings, no_wake, django_capture_on_commit_callbacks
):
    settings.ATLAS_WEBHOOK_MAX_ATTEMPTS = 2
    [only] = commit(staff, 1)
    healthy = {"on": False}
    receiver = receivers(respond=lambda n, d: 200 if healthy["on"] else 502)
    sub = subscribe(receiver.url)
    assert pump_until_settled(sub)[-1] == "parked"
    healthy["on"] = True
    no_wake.clear()

    with django_capture_on_commit_callbacks(execute=True):
        subscription_retry(subscription_id=sub.id, actor=root)

    assert no_wake == [(str(sub.id), None)]  # the pump is woken
    assert pump(sub) == "idle"
    sub = refresh(sub)
    assert sub.parked_seq is None and sub.cursor_seq == only.seq
    assert (
        receiver.accepted()[0].headers["webhook-id"] == receiver.deliveries[0].headers["webhook-id"]
    )


def test_skip_moves_past_the_parked_changeset_and_records_who(
    staff, root, namespace, receivers, settings, no_wake, caplog
):
    settings.ATLAS_WEBHOOK_MAX_ATTEMPTS = 2
    bad, good = commit(staff, 2)
    receiver = receivers(respond=lambda n, d: 400 if str(bad.id) in changeset_ids(d) else 200)
    sub = subscribe(receiver.url)
    settings.ATLAS_WEBHOOK_PAGE_SIZE = 1  # one changeset per delivery
    assert pump_until_settled(sub)[-1] == "parked"

    with caplog.at_level("WARNING", logger="changesets.outbox.subscriptions"):
        skipped = subscription_skip(subscription_id=sub.id, actor=root)

    assert skipped.cursor_seq == bad.seq and skipped.parked_seq is None
    assert f"skipped seq {bad.seq} by root" in skipped.last_error
    assert "HTTP 400" in skipped.last_error
    assert f"skipped seq {bad.seq} by root" in caplog.text
    assert pump(sub) == "idle"
    assert [changeset_ids(d) for d in receiver.accepted()] == [{str(good.id)}]


def test_a_failing_page_of_several_changesets_narrows_so_only_the_bad_one_parks(
    staff, root, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_MAX_ATTEMPTS = 3
    first, bad, last = commit(staff, 3)
    receiver = receivers(respond=lambda n, d: 422 if str(bad.id) in changeset_ids(d) else 200)
    sub = subscribe(receiver.url)

    outcomes = pump_until_settled(sub)

    # The page of three failed 3 times; then one changeset per delivery: the first
    # goes through, the bad one fails 3 times and parks alone.
    assert outcomes == ["failed", "failed", "failed", "failed", "parked"]
    assert [len(changeset_ids(d)) for d in receiver.deliveries] == [3, 3, 3, 1, 1, 1, 1]
    sub = refresh(sub)
    assert sub.cursor_seq == first.seq
    assert (sub.parked_seq, sub.parked_attempts) == (bad.seq, 3)

    subscription_skip(subscription_id=sub.id, actor=root)
    assert pump(sub) == "idle"
    assert [changeset_ids(d) for d in receiver.accepted()] == [{str(first.id)}, {str(last.id)}]
    assert refresh(sub).cursor_seq == last.seq


def test_a_part_that_keeps_failing_parks_with_its_part_and_skip_passes_the_whole_changeset(
    staff, root, namespace, receivers, settings, no_wake
):
    settings.ATLAS_WEBHOOK_MAX_ATTEMPTS = 2
    settings.ATLAS_WEBHOOK_PAGE_SIZE = 2
    [big] = commit(staff, 1, width=5)
    [later] = commit(staff, 1, start=10)
    receiver = receivers(respond=lambda n, d: 500 if d.document.get("part") == 2 else 200)
    sub = subscribe(receiver.url)

    assert pump_until_settled(sub)[-1] == "parked"
    sub = refresh(sub)
    assert (sub.parked_seq, sub.parked_part, sub.cursor_seq) == (big.seq, 2, 0)

    skipped = subscription_skip(subscription_id=sub.id, actor=root)
    assert skipped.cursor_seq == big.seq and skipped.part_seq is None
    assert f"skipped seq {big.seq} part 2 by root" in skipped.last_error
    assert pump(sub) == "idle"
    assert changeset_ids(receiver.accepted()[-1]) == {str(later.id)}


def test_metrics_show_parked_subscriptions(
    staff, root, namespace, receivers, settings, client, monkeypatch
):
    from changesets.outbox import metrics
    from tests.changesets.test_journal import metric

    # The changeset counter is process-wide and incremental: scrape with a fresh one so
    # this test's rolled-back changesets do not stay counted for later tests.
    monkeypatch.setattr(metrics, "_changeset_counts", metrics._ChangesetCounts())
    settings.ATLAS_WEBHOOK_MAX_ATTEMPTS = 1
    commit(staff, 1)
    receiver = receivers(respond=lambda n, d: 500)
    parked = subscribe(receiver.url, name="parked")
    fine = subscribe(receiver.url, name="fine", start="now")
    pumps.subscription_pump(subscription_id=str(parked.id))
    client.force_login(root)

    text = client.get("/metrics").content.decode()

    assert metric(text, "atlas_subscriptions_parked") == 1
    assert metric(text, "atlas_subscription_parked", subscription=str(parked.id)) == 1
    assert metric(text, "atlas_subscription_parked", subscription=str(fine.id)) == 0


# --- the SSRF rule at delivery time ------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b:1::a00:1",  # local-use NAT64
        "::a00:1",  # IPv4-compatible 10.0.0.1
        "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo, client 10.0.0.1
    ],
)
def test_ipv6_wrappers_of_private_ipv4_are_refused_at_delivery(
    staff, namespace, receivers, settings, no_wake, monkeypatch, address
):
    commit(staff, 1)
    sub = subscribe("http://hook.example.com/x")
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = False
    connects: list[Any] = []
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, port, *a, **k: [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port))],
    )
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: connects.append(a))

    assert pump(sub) == "failed"

    assert connects == []
    assert "non-public" in refresh(sub).last_error


# --- the size arithmetic, against the bodies themselves ------------------------------------------


ENVELOPE_MARGIN = 40


@pytest.mark.parametrize("limit", [1600, 2200, 4096, 9000])  # records carry provenance
def test_planned_parts_are_the_largest_bodies_within_the_limit(staff, namespace, settings, limit):
    """Witness for the size estimate: each part's real body fits, and one more record
    would not have fitted but for the envelope's margin (parts are sized with an
    upper bound of the envelope: 10-digit part numbers and the final cursor)."""
    settings.ATLAS_WEBHOOK_MAX_BODY_BYTES = limit
    ops = [PutOp(key(f"{NS}/order/w{j}"), {"blob": "é" * (37 * j % 400)}) for j in range(40)]
    changeset_apply(store=baseline, actor=staff, ops=ops, rpc=Rpc.BATCH_MUTATE)
    sub = subscribe("http://127.0.0.1:9/a")
    page = feed.feed_page(after_seq=0, namespaces=None, limit=100)
    seen: list[str] = []
    while True:
        out = payloads.plan_delivery(sub, page)
        assert not out.oversize
        assert len(out.body) <= limit
        document = json.loads(out.body)
        seen += [r["event_id"] for r in document["records"]]
        if out.last_part:
            break
        start = out.offset + out.records
        bigger = feed.FeedPage(
            records=page.records[out.offset : start + 1],
            after_seq=page.after_seq,
            last_seq=page.after_seq,
            capture=page.capture,
            watermark=page.watermark,
        )
        grown = payloads.page_body(sub, bigger, out.delivery, part=out.part, parts=out.parts)
        assert len(grown) > limit - ENVELOPE_MARGIN
        sub.part_seq, sub.part_offset, sub.parts_done = out.seq, start, out.part
    assert seen == [r["event_id"] for r in page.records]


def test_the_admin_shows_a_parked_subscription(root, namespace, client):
    sub = subscribe("http://127.0.0.1:9/a", name="dead-letter")
    Subscription.objects.filter(pk=sub.pk).update(
        parked_seq=7, parked_part=2, parked_attempts=20, parked_error="HTTP 500: boom"
    )
    client.force_login(root)

    listing = client.get("/admin/changesets/subscription/").content.decode()
    assert "parked at seq 7" in listing and "seq 7 part 2, 20 attempt(s)" in listing
    filtered = client.get("/admin/changesets/subscription/?parked=no").content.decode()
    assert "dead-letter" not in filtered
    detail = client.get(f"/admin/changesets/subscription/{sub.pk}/change/").content.decode()
    assert "HTTP 500: boom" in detail
    assert sub.secret not in detail
