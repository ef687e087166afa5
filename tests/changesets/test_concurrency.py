"""``changeset_apply`` under real concurrency: threads, each with its own connection.

Every test commits for real (``transaction=True``) and every thread closes
its connection when it ends, so the test database can be flushed afterwards.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from atlas.exceptions import PreconditionFailed
from changesets.models import Changeset, Revision, Rpc
from changesets.ops import PutOp
from changesets.services import apply as services
from changesets.services.apply import changeset_apply
from entities.store import BaselineStore, EntityKey, baseline
from entities.writer import changeset_marker
from tests.changesets.helpers import entity_table, key, replayed_table

pytestmark = pytest.mark.django_db(transaction=True)

NS = "acme.orders"
THREAD_TIMEOUT = 40


def run_in_threads(*targets: Callable[[], Any]) -> list[Any]:
    """Run each target in its own thread; return what each returned or raised."""
    outcomes: list[Any] = [None] * len(targets)

    def run(i: int, target: Callable[[], Any]) -> None:
        try:
            outcomes[i] = target()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test to judge
            outcomes[i] = exc
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=(i, t), name=f"t{i}") for i, t in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread hung (deadlock?)"
    return outcomes


def assert_no_errors(outcomes: list[Any]) -> None:
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert not errors, errors


def put(actor: Any, k: EntityKey, content: dict, **kw: Any):
    return changeset_apply(
        store=baseline, actor=actor, ops=[PutOp(k, content, **kw)], rpc=Rpc.PUT_ENTITY
    )


@pytest.fixture
def race_at_lock(monkeypatch) -> Callable[[int], list[str]]:
    """``calls = race_at_lock(2)``: from now on, hold each thread's first attempt
    just after it locked, until all ``parties`` have locked.

    So every racer has seen the key as missing before anyone creates it: the
    create race is forced, not left to timing. Returns the (growing) list of
    lock calls, one per attempt.
    """

    def arm(parties: int) -> list[str]:
        calls: list[str] = []
        barrier = threading.Barrier(parties, timeout=10)
        real_lock = BaselineStore.lock

        def lock(self, keys, **kw):
            locked = real_lock(self, keys, **kw)
            me = threading.current_thread().name
            first = me not in calls
            calls.append(me)
            if first:
                barrier.wait()
            return locked

        monkeypatch.setattr(BaselineStore, "lock", lock)
        return calls

    return arm


def test_concurrent_if_match_increments_lose_no_update(writer, namespace):
    counter = key(f"{NS}/counter/c")
    put(writer, counter, {"counter": 0})
    threads, increments = 8, 25
    refused = [0]

    def increment_many() -> int:
        done = 0
        while done < increments:
            current = baseline.get(counter)
            try:
                put(
                    writer,
                    counter,
                    {"counter": current.content["counter"] + 1},
                    if_match=current.version,
                )
            except PreconditionFailed:
                refused[0] += 1
                continue
            done += 1
        return done

    outcomes = run_in_threads(*[increment_many] * threads)

    assert_no_errors(outcomes)
    final = baseline.get(counter)
    assert sum(outcomes) == threads * increments
    assert final.content["counter"] == threads * increments == final.version - 1
    # Every success is one changeset whose revision moved the counter by exactly one.
    revisions = list(Revision.objects.filter(slug="c").order_by("seq"))
    assert len(revisions) == threads * increments + 1
    assert all(
        r.after["counter"] == r.before["counter"] + 1 == r.after_version - 1 for r in revisions[1:]
    )
    assert replayed_table() == entity_table()
    print(f"\n{refused[0]} If-Match refusals over {threads * increments} increments")


@pytest.mark.parametrize("path", ["locked", "unlocked"])
def test_a_polling_reader_sees_every_changeset_once_in_seq_order(
    writer, namespace, monkeypatch, request, path
):
    """Locked, the window between drawing seq and COMMIT is widened (the pause after
    the log statement); unlocked, the log statement commits as it ends."""
    if path == "locked":
        request.getfixturevalue("locked_writes")
    real_lock = BaselineStore.lock
    real_write_log = services._write_log

    def slow_lock(self, *args, **kw):
        out = real_lock(self, *args, **kw)
        time.sleep(random.uniform(0, 0.005))  # rows locked, no seq yet: writers overlap here
        return out

    def slow_write_log(*args, **kw):
        out = real_write_log(*args, **kw)
        time.sleep(random.uniform(0, 0.002))  # widen the window between seq drawn and commit
        return out

    monkeypatch.setattr(BaselineStore, "lock", slow_lock)
    monkeypatch.setattr(services, "_write_log", slow_write_log)
    put(writer, key(f"{NS}/warm/up"), {})  # role table cached on the shared actor
    start = Changeset.objects.order_by("-seq").values_list("seq", flat=True).first()
    writers, writes_each = 8, 40
    writers_done = threading.Event()
    seen: list[int] = []
    gaps: list[tuple[int, list[int]]] = []

    def write_many(n: int) -> Callable[[], int]:
        def run() -> int:
            for j in range(writes_each):
                put(writer, key(f"{NS}/w{n}/e{j % 5}"), {"j": j})
            return writes_each

        return run

    def read_feed() -> int:
        last = start
        polls = 0
        while True:
            finished = writers_done.is_set()  # read before polling: the last poll is complete
            batch = list(
                Changeset.objects.filter(seq__gt=last).order_by("seq").values_list("seq", flat=True)
            )
            polls += 1
            if batch != list(range(last + 1, last + 1 + len(batch))):
                gaps.append((last, batch))
            seen.extend(batch)
            if batch:
                last = batch[-1]
            if finished:
                return polls

    def writers_then_signal() -> list[Any]:
        try:
            return run_in_threads(*[write_many(n) for n in range(writers)])
        finally:
            writers_done.set()

    reader_outcome, writer_outcomes = run_in_threads(read_feed, writers_then_signal)

    assert not isinstance(reader_outcome, BaseException), reader_outcome
    assert not isinstance(writer_outcomes, BaseException), writer_outcomes
    assert_no_errors(writer_outcomes)
    assert not gaps, f"the reader saw a seq before an earlier one was visible: {gaps[:3]}"
    committed = list(
        Changeset.objects.filter(seq__gt=start).order_by("seq").values_list("seq", flat=True)
    )
    assert len(committed) == writers * writes_each
    assert committed == list(range(start + 1, start + 1 + writers * writes_each))
    assert seen == committed  # every changeset exactly once, in seq order
    ats = list(Changeset.objects.order_by("seq").values_list("at", flat=True))
    assert ats == sorted(ats)
    assert replayed_table() == entity_table()
    print(f"\nreader: {reader_outcome} polls, {len(seen)} changesets")


def test_concurrent_if_none_match_creates_of_one_key_let_exactly_one_win(
    writer, namespace, race_at_lock
):
    target = key(f"{NS}/order/new")
    put(writer, key(f"{NS}/warm/up"), {})  # role table cached on the shared actor
    lock_calls = race_at_lock(2)

    def create(n: int) -> Callable[[], Any]:
        return lambda: put(writer, target, {"by": n}, if_none_match=True)

    outcomes = run_in_threads(create(1), create(2))

    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert isinstance(losers[0], PreconditionFailed), repr(losers[0])
    assert [(r.status, r.version) for r in winners[0].results] == [("created", 1)]
    assert baseline.get(target).content == {"by": 1 + outcomes.index(winners[0])}
    assert Changeset.objects.filter(revisions__slug="new").count() == 1
    assert len(lock_calls) == 3, "the loser should have lost the insert race and retried"


def test_concurrent_plain_puts_creating_one_key_both_land(writer, namespace, race_at_lock):
    target = key(f"{NS}/order/new")
    put(writer, key(f"{NS}/warm/up"), {})  # role table cached on the shared actor
    lock_calls = race_at_lock(2)

    def create(n: int) -> Callable[[], Any]:
        return lambda: put(writer, target, {"by": n})

    outcomes = run_in_threads(create(1), create(2))

    assert_no_errors(outcomes)
    statuses = sorted((r.results[0].status, r.results[0].version) for r in outcomes)
    assert statuses == [("created", 1), ("updated", 2)]
    changesets = list(Changeset.objects.filter(revisions__slug="new").order_by("seq"))
    assert len(changesets) == 2
    first, second = (cs.revisions.get() for cs in changesets)
    assert (first.op, first.after_version) == ("create", 1)
    assert (second.op, second.before, second.before_version) == ("update", first.after, 1)
    assert baseline.get(target).version == 2
    assert len(lock_calls) == 3, "the loser should have lost the insert race and retried"


def test_a_write_takes_the_log_head_only_after_its_entity_rows_are_written(writer, namespace):
    """The entity writes and the seq draw are one statement; the head's update reads
    the writes' row counts first, so a write still waiting to write its rows (here a
    create, waiting on another session's uncommitted insert of the same key) holds no
    lock on the head, and every other writer goes on committing meanwhile."""
    from django.db import transaction

    target = key(f"{NS}/order/contested")
    warm = put(writer, key(f"{NS}/warm/up"), {}).changeset
    inserted, release = threading.Event(), threading.Event()

    def other_session() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                # A stand-in for a racing writer: it holds the marker the entity guard
                # wants for the row's changeset (entities.writer), as the service would.
                cursor.execute(
                    "SELECT set_config('atlas.writer', %s, true)", [changeset_marker(warm.id)]
                )
                cursor.execute(
                    "INSERT INTO entities_entity (namespace_id, kind, slug, content, version,"
                    " created_at, updated_at, changeset_id) VALUES (%s, %s, %s, '{\"by\": 0}',"
                    " 1, now(), now(), %s)",
                    [target.namespace, target.kind, target.slug, warm.id],
                )
                inserted.set()
                assert release.wait(THREAD_TIMEOUT)
        finally:
            inserted.set()

    def creator() -> Any:
        assert inserted.wait(THREAD_TIMEOUT)
        return put(writer, target, {"by": 1})

    def meanwhile() -> Any:
        assert inserted.wait(THREAD_TIMEOUT)
        time.sleep(0.5)  # the creator is waiting on the other session's insert by now
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE '%%INSERT INTO entities_entity%%'"
                )
                waiting = cursor.fetchall()
                cursor.execute("SELECT seq FROM changesets_loghead WHERE id = 1 FOR UPDATE NOWAIT")
                head_free = cursor.fetchone() is not None
            other = put(writer, key(f"{NS}/order/other"), {"n": 1})  # commits meanwhile
            return waiting, head_free, other
        finally:
            release.set()

    outcomes = run_in_threads(other_session, creator, meanwhile)

    assert_no_errors(outcomes)
    _, created, (waiting, head_free, other) = outcomes
    assert waiting, "the creator should have been waiting on the other session's insert"
    assert head_free, "a write waiting to write its rows must not hold the log head"
    assert other.changeset.seq < created.changeset.seq
    # The other session's row won the race (a raw insert); the creator retried and
    # updated it.
    assert [(r.status, r.version) for r in created.results] == [("updated", 2)]
