"""Publishing is set-based (issue 15): N changesets cost a constant number of queries and
at most one pump message per subscription, and the relay's wake query stays an index seek
however large the backlog."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from changesets.models import JournalEntry, JournalPhase, Subscription
from changesets.outbox import journal
from changesets.outbox.relay import NEXT_BATCH
from changesets.outbox.subscriptions import subscription_create
from changesets.signals import changeset_committed
from tests.entities.factories import NamespaceFactory

pytestmark = pytest.mark.django_db

NS = "acme.orders"


@pytest.fixture
def woken(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(
        "changesets.outbox.pumps.enqueue_pump", lambda sid, countdown=None: calls.append(sid)
    )
    return calls


@pytest.fixture
def hooked() -> Iterator[list[Any]]:
    seen: list[Any] = []
    changeset_committed.connect(
        lambda sender, changeset, **kw: seen.append(changeset.id),
        dispatch_uid="test-sets-hook",
        weak=False,
    )
    yield seen
    changeset_committed.disconnect(dispatch_uid="test-sets-hook")


def committed(write: Callable[..., Any], staff: Any, n: int, start: int = 0) -> list[Any]:
    return [
        write(staff, f"{NS}/order/k{i}", {"n": i}).changeset.id for i in range(start, start + n)
    ]


def queries_to_publish(ids: list[Any]) -> tuple[int, dict[Any, str]]:
    with CaptureQueriesContext(connection) as ctx:
        outcomes = journal.publish(ids)
    return len(ctx.captured_queries), outcomes


def test_without_hooks_or_subscriptions_publishing_is_one_statement_whatever_n(
    staff, namespace, write
):
    one, outcomes_one = queries_to_publish(committed(write, staff, 1))
    many, outcomes_many = queries_to_publish(committed(write, staff, 40, start=1))

    assert set(outcomes_one.values()) == set(outcomes_many.values()) == {journal.PUBLISHED}
    assert len(outcomes_many) == 40
    assert one == many
    # One statement claims, deletes and finds the due subscriptions, inside the
    # savepoint the test's transaction turns the atomic block into.
    assert many == 3
    assert not JournalEntry.objects.exists()


def test_with_a_subscription_each_batch_wakes_its_pump_once(
    staff, namespace, write, woken, settings
):
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    NamespaceFactory(name="acme.billing")
    orders = subscription_create(actor=None, name="o", url="http://127.0.0.1:9/", namespaces=[NS])
    subscription_create(
        actor=None, name="b", url="http://127.0.0.1:9/", namespaces=["acme.billing"]
    )
    backing_off = subscription_create(actor=None, name="r", url="http://127.0.0.1:9/")
    Subscription.objects.filter(pk=backing_off.pk).update(
        next_attempt_at=timezone.now() + timedelta(minutes=5)
    )
    parked = subscription_create(actor=None, name="p", url="http://127.0.0.1:9/")
    Subscription.objects.filter(pk=parked.pk).update(parked_seq=1)
    woken.clear()  # creating a subscription wakes its pump after commit

    one, _ = queries_to_publish(committed(write, staff, 1))
    assert woken == [str(orders.id)]
    many, outcomes = queries_to_publish(committed(write, staff, 40, start=1))

    assert set(outcomes.values()) == {journal.PUBLISHED}
    assert one == many == 3  # the same statement as with no subscription
    assert woken == [str(orders.id)] * 2, "one pump message per batch, not per changeset"


def test_with_hooks_the_queries_do_not_grow_with_n(staff, namespace, write, hooked):
    one, _ = queries_to_publish(committed(write, staff, 1))
    ids = committed(write, staff, 40, start=1)
    many, outcomes = queries_to_publish(ids)

    assert set(outcomes.values()) == {journal.PUBLISHED}
    # Each hook runs in a savepoint of its own (two statements per entry, no
    # query); everything else is constant: claim, classify-free, one delete.
    assert many - 2 * 40 == one - 2 * 1
    assert hooked[-40:] == ids
    assert not JournalEntry.objects.exists()


def test_with_hooks_failures_are_recorded_in_one_statement_whatever_n(staff, namespace, write):
    def failing(sender, changeset, **kwargs):
        raise RuntimeError(f"no index for {changeset.id}")

    changeset_committed.connect(failing, dispatch_uid="test-sets-failing", weak=False)
    try:
        one, outcomes_one = queries_to_publish(committed(write, staff, 1))
        many, outcomes_many = queries_to_publish(committed(write, staff, 40, start=1))
    finally:
        changeset_committed.disconnect(dispatch_uid="test-sets-failing")

    assert set(outcomes_one.values()) == set(outcomes_many.values()) == {journal.COMMITTED}
    # A failed entry's savepoint is three statements (SAVEPOINT, ROLLBACK TO, RELEASE);
    # everything else is constant: claim, one UPDATE for every error, no delete.
    assert many - 3 * 40 == one - 3 * 1
    assert JournalEntry.objects.filter(phase=JournalPhase.COMMITTED, failures=1).count() == 41


def test_outcomes_classify_what_was_not_claimed(staff, namespace, write):
    ids = committed(write, staff, 3)
    journal.publish(ids[:1])

    outcomes = journal.publish([*ids, "0" * 32])

    assert list(outcomes.values()) == [
        journal.ALREADY_PUBLISHED,
        journal.PUBLISHED,
        journal.PUBLISHED,
        journal.MISSING,
    ]


BACKLOG = 100_000


def seed_backlog(cursor: Any, n: int) -> None:
    """``n`` committed changesets with outstanding journal entries, straight in SQL."""
    cursor.execute("SELECT COALESCE(max(seq), 0) FROM changesets_changeset")
    first = cursor.fetchone()[0] + 1
    cursor.execute(
        "INSERT INTO changesets_changeset (id, seq, author_name, at, message, comment, branch,"
        " rpc, op_count, namespaces, prev_hash, hash)"
        " SELECT gen_random_uuid(), s, 'seed', now(), '', '', '', 'PutEntity', 1,"
        " ARRAY[%s]::varchar[], NULL, NULL FROM generate_series(%s, %s) AS s",
        [NS, first, first + n - 1],
    )
    cursor.execute(
        "INSERT INTO changesets_journalentry (changeset_id, seq, phase, created_at, attempts,"
        " last_error, failures)"
        " SELECT id, seq, 'committed', at, 0, '', 0 FROM changesets_changeset WHERE seq >= %s",
        [first],
    )
    cursor.execute("ANALYZE changesets_journalentry")


def plan(cursor: Any, sql: str, params: list[Any]) -> dict[str, Any]:
    cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
    raw = cursor.fetchone()[0]
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def test_the_relay_wake_query_is_an_index_seek_at_a_large_backlog(namespace):
    with connection.cursor() as cursor:
        seed_backlog(cursor, BACKLOG)
        cursor.execute("SELECT min(seq) FROM changesets_journalentry")
        first = cursor.fetchone()[0]
        for mark in (first - 1, first + BACKLOG // 2):
            found = plan(cursor, NEXT_BATCH, [mark, 200])
            kinds = [n["Node Type"] for n in nodes(found)]
            scans = [n for n in nodes(found) if "Scan" in n["Node Type"]]
            assert "Seq Scan" not in kinds and "Sort" not in kinds, kinds
            assert [s.get("Index Name") for s in scans] == ["journal_pending"], scans
            assert found["Plan Rows"] <= 200
