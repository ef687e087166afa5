"""The revision table's partitions: migration 0025 and upkeep ahead of the head.

No DEFAULT partition (``changesets.partitions``), so these pin what keeps
every write landing somewhere: a write at the last partition's edge, upkeep
making the next one (from the journal's cheap check too), upkeep while
writers run (real threads, the 100 ms lock bound), and an existing populated
table moved onto partitions by the migration with every row, index,
constraint and trigger, and the chain verifying.
"""

from __future__ import annotations

import threading
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext

from changesets import partitions
from changesets.models import Revision
from tests.changesets.partition_helpers import layout, standard

NS = "acme.orders"


def _shape() -> dict[str, list[str]]:
    """The parent's indexes, constraints and triggers, by name and definition."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'changesets_revision' ORDER BY 1"
        )
        indexes = [r[0] for r in cursor.fetchall()]
        cursor.execute(
            # (not the foreign key's clones, one per partition of the changeset table)
            "SELECT conname FROM pg_constraint WHERE conrelid = 'changesets_revision'::regclass"
            " AND conparentid = 0 ORDER BY 1"
        )
        constraints = [r[0] for r in cursor.fetchall()]
        cursor.execute(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger"
            " WHERE tgrelid = 'changesets_revision'::regclass AND NOT tgisinternal ORDER BY 1"
        )
        triggers = [r[0] for r in cursor.fetchall()]
    return {"indexes": indexes, "constraints": constraints, "triggers": triggers}


def _both(lower: int, upper: int) -> list[tuple[str, int, int]]:
    """The partitions upkeep makes for one range: the changeset table's, then the
    revision table's (migration 0038)."""
    return [
        (partitions.partition_name(lower, parent), lower, upper) for parent in partitions.PARENTS
    ]


def test_ranges_to_make_fill_gaps_and_go_on_from_the_last_partition():
    existing = [partitions.Partition("a", 0, 10), partitions.Partition("b", 20, 30)]
    assert partitions.missing(1, 45, existing, step=10) == [(10, 20), (30, 40), (40, 50)]
    assert partitions.missing(5, 8, existing, step=10) == []
    assert partitions.missing(1, 3, [], step=10) == [(0, 10)]


@pytest.mark.django_db
def test_a_write_at_the_last_partitions_edge_commits_once_upkeep_made_the_next(
    staff, namespace, write, settings
):
    settings.ATLAS_LOG_PARTITION_SEQS = 3
    settings.ATLAS_LOG_PARTITIONS_AHEAD = 1
    layout([(0, 3)])
    write(staff, f"{NS}/order/a", {"n": 1})
    write(staff, f"{NS}/order/a", {"n": 2})  # seq 2: the last the partition holds
    with pytest.raises(DatabaseError, match="no partition"), transaction.atomic():
        write(staff, f"{NS}/order/a", {"n": 3})  # seq 3: nowhere to go (no DEFAULT)
    made = partitions.ensure_ahead()
    assert [(p.name, p.lower, p.upper) for p in made] == _both(3, 6)
    assert write(staff, f"{NS}/order/a", {"n": 3}).changeset.seq == 3
    # Head 3: upkeep covers seqs 4-6, so [6, 9) comes next; then nothing until the head moves.
    assert [(p.name, p.lower, p.upper) for p in partitions.ensure_ahead()] == _both(6, 9)
    assert partitions.ensure_ahead() == []
    assert partitions.headroom() == 5


@pytest.mark.django_db
def test_the_relays_cheap_check_makes_the_next_partition(staff, namespace, write, settings):
    from changesets.outbox import relay

    settings.ATLAS_LOG_PARTITION_SEQS = 4
    settings.ATLAS_LOG_PARTITIONS_AHEAD = 1
    layout([(0, 4)])
    write(staff, f"{NS}/order/a", {"n": 1})
    partitions.forget()
    relay._partition_headroom(1)  # the relay passes its mark: head 1 + 4 reaches 4
    assert [p.lower for p in partitions.partitions()] == [0, 4]
    # The relay's check read the real monotonic clock; the fake times go on from it (a
    # machine up for hours has a clock far past any small constant, and the check would
    # think it had just run).
    base = time.monotonic()
    for n in range(2, 9):
        write(staff, f"{NS}/order/a", {"n": n})
        partitions.check_headroom(seq=n, now=base + 1000.0 * n)
    assert partitions.headroom() >= 1
    # Quiet between checks: the same second asks nothing of the database.
    with CaptureQueriesContext(connection) as queries:
        partitions.check_headroom(seq=8, now=base + 8000.5)
    assert not queries.captured_queries


@pytest.mark.django_db(transaction=True)
def test_an_attach_waits_for_no_writer_in_flight(make_user, namespace, settings):
    """Both tables' partitions attach while a write holds its transaction open
    (migration 0038): the attach locks the parents in SHARE UPDATE EXCLUSIVE only,
    and a revision partition's key points at the new changeset partition. (With
    the key on the revision table's parent, attaching a revision partition took
    SHARE ROW EXCLUSIVE on the changeset table and waited for the write to end.)"""
    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.store import EntityKey, baseline

    settings.ATLAS_LOG_PARTITION_SEQS = 10
    root = make_user("root", superuser=True)
    layout([(0, 10)])
    holding, release, errors = threading.Event(), threading.Event(), []

    def writer() -> None:
        try:
            with transaction.atomic():
                op = PutOp(EntityKey(NS, "w", "held"), {"n": 1})
                changeset_apply(store=baseline, actor=root, rpc=Rpc.PUT_ENTITY, ops=[op])
                holding.set()
                release.wait(timeout=30)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            holding.set()
            connection.close()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert holding.wait(timeout=30)
        with CaptureQueriesContext(connection) as queries:
            made = partitions.ensure_covering(10, 30)
        still_open = thread.is_alive()
    finally:
        release.set()
        thread.join(timeout=30)
    try:
        assert not errors, errors
        assert still_open  # the write had not ended when the attaches were done
        assert [(p.name, p.lower) for p in made] == [
            (partitions.partition_name(lower, parent), lower)
            for parent in partitions.PARENTS
            for lower in (10, 20)
        ]
        # One try each: no lock_timeout expired (a try that timed out is tried again).
        tries = [q for q in queries.captured_queries if q["sql"].startswith("SET LOCAL lock_")]
        assert len(tries) == 2 * len(made), tries  # (each try sets it, then resets it)
    finally:
        standard()


@pytest.mark.django_db(transaction=True)
def test_upkeep_makes_partitions_while_writers_run(make_user, namespace, settings, capsys):
    """Three writer threads; upkeep attaches a partition every few seqs under them."""
    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.store import EntityKey, baseline

    # Twelve widths ahead: since migration 0038 each range is two attaches (a changeset
    # partition, then its revision partition), and under a loaded test run three
    # widths of these writers' seqs were sometimes used up before both were made, and
    # six once, with a benchmark running beside the suite.
    settings.ATLAS_LOG_PARTITION_SEQS = 20
    settings.ATLAS_LOG_PARTITIONS_AHEAD = 12
    root = make_user("root", superuser=True)
    layout([(0, 120)])
    stop, errors, latencies = threading.Event(), [], []

    def writer(index: int) -> None:
        n = 0
        try:
            while not stop.is_set():
                started = time.perf_counter()
                op = PutOp(EntityKey(NS, "w", f"{index}-{n % 5}"), {"n": n})
                changeset_apply(store=baseline, actor=root, rpc=Rpc.PUT_ENTITY, ops=[op])
                latencies.append(time.perf_counter() - started)
                n += 1
                time.sleep(0.005)  # saturated writers starve the attach (docs/retention.md)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    made = 0
    deadline = time.monotonic() + 6
    attach_ms = []
    while time.monotonic() < deadline and not errors:
        started = time.perf_counter()
        made_now = len(partitions.ensure_ahead())
        if made_now:
            attach_ms.append((time.perf_counter() - started) * 1000 / made_now)
        made += made_now
        time.sleep(0.01)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    try:
        assert not errors, errors
        assert made >= 3 and len(latencies) > 20
        writes = sorted(latencies)
        with capsys.disabled():
            print(
                f"\n[partition upkeep] {made} partitions attached under {len(writes)} writes:"
                f" p50 {writes[len(writes) // 2] * 1000:.1f} ms,"
                f" p99 {writes[int(len(writes) * 0.99)] * 1000:.1f} ms,"
                f" max {writes[-1] * 1000:.1f} ms; an attach took {min(attach_ms):.0f}-"
                f"{max(attach_ms):.0f} ms"
            )
    finally:
        standard()


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_a_populated_table_onto_partitions(staff, namespace, write):
    for n in range(30):
        write(staff, f"{NS}/order/k{n % 7}", {"n": n} if n % 5 else {"n": n, "pad": "x" * 50})
    write(staff, f"{NS}/order/k1", None)
    rows = sorted(Revision.objects.values_list("id", "seq", "changed", "after"))
    shape = _shape()
    executor = MigrationExecutor(connection)
    executor.migrate([("changesets", "0024_archive_delete_guard")])
    assert not partitions.is_partitioned()
    assert sorted(Revision.objects.values_list("id", "seq", "changed", "after")) == rows
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert partitions.is_partitioned()
    assert sorted(Revision.objects.values_list("id", "seq", "changed", "after")) == rows
    assert _shape() == shape
    call_command("verify_log", "--no-progress", stdout=StringIO())  # exits 1 on a break
    # The id sequence goes on past the moved rows.
    assert write(staff, f"{NS}/order/new", {"n": 1}).changeset.seq == 32
    assert Revision.objects.order_by("-id").first().id > max(r[0] for r in rows)


def _partition_indexes(name: str) -> dict[str, bool]:
    """Each of partition ``name``'s indexes, by the parent index it belongs to: unique?"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_partition_root(i.indexrelid)::regclass::text, i.indisunique"
            " FROM pg_index i WHERE i.indrelid = to_regclass(%s)",
            [name],
        )
        return dict(cursor.fetchall())


@pytest.mark.django_db
def test_a_new_partition_gets_the_seq_entity_constraint_and_not_the_indexes_it_replaced(
    staff, namespace, write, settings
):
    """Migration 0028: ``revision_seq_entity`` in place of ``revision_seq`` and
    ``revision_one_per_entity_changeset``, on partitions made before it (the
    migration's) and on every one upkeep attaches after it."""
    settings.ATLAS_LOG_PARTITION_SEQS = 3
    settings.ATLAS_LOG_PARTITIONS_AHEAD = 1
    shape = _shape()
    assert "revision_seq_entity" in shape["constraints"]
    assert "revision_seq" not in shape["indexes"]
    assert "revision_one_per_entity_changeset" not in shape["constraints"]
    layout([(0, 3)])
    made = partitions.ensure_covering(3, 6)
    assert [(p.name, p.lower, p.upper) for p in made] == _both(3, 6)
    parent = set(shape["indexes"])
    for part in partitions.partitions():
        found = _partition_indexes(part.name)  # (the revision table's)
        assert set(found) == parent, part.name  # one of each, no more
        assert found["revision_seq_entity"] is True
    # Invariant 4 on the new partition: a second row for the entity at that seq is refused.
    for n in range(4):
        write(staff, f"{NS}/order/a", {"n": n})  # seq 4 lands in the new partition
    refused = pytest.raises(IntegrityError, match="unique constraint")
    with refused, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO changesets_revision (changeset_id, seq, branch, at, namespace,"
            " kind, slug, op, undo, undo_gone, after, before_version, after_version, changed)"
            " SELECT changeset_id, seq, branch, at, namespace, kind, slug, op, undo, undo_gone,"
            " after, before_version, after_version, changed FROM changesets_revision"
            " WHERE seq = 4"
        )


@pytest.mark.django_db
def test_the_beat_task_keeps_partitions_ahead(settings):
    from django.conf import settings as django_settings

    from changesets.tasks import partition_upkeep

    assert django_settings.CELERY_BEAT_SCHEDULE["partition-upkeep"]["task"] == (
        "changesets.partition_upkeep"
    )
    settings.ATLAS_LOG_PARTITION_SEQS = 10
    settings.ATLAS_LOG_PARTITIONS_AHEAD = 2
    layout([(0, 5)])
    result = partition_upkeep()
    assert result["made"] == [  # each table's in turn, the changeset table's first
        partitions.partition_name(lower, parent)
        for parent in partitions.PARENTS
        for lower in (5, 15)
    ]
    assert result["headroom"] == 24


@pytest.mark.django_db(transaction=True)
def test_two_processes_making_the_same_partitions_both_succeed(settings):
    """Two workers' upkeep at once (two ``migrate``s, two beat runs): no 'already exists'."""
    settings.ATLAS_LOG_PARTITION_SEQS = 3
    settings.ATLAS_LOG_PARTITIONS_AHEAD = 10
    layout([(0, 3)])
    errors: list[Exception] = []
    barrier = threading.Barrier(3)

    def upkeep() -> None:
        try:
            barrier.wait(timeout=10)
            partitions.ensure_ahead()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=upkeep) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert not errors, errors
        bounds = [(p.lower, p.upper) for p in partitions.partitions()]
        assert bounds == [(n, n + 3) for n in range(0, 33, 3)]
    finally:
        standard()


@pytest.mark.django_db
def test_as_of_time_for_a_scoped_reader_walks_down_the_partitions(staff, namespace, write):
    """A scoped reader's ``as_of_time`` looks a partition at a time from the time's
    boundary down (migration 0038): her newest changeset is two partitions below."""
    from django.utils import timezone

    from changesets.selectors import asof
    from entities.models import Namespace

    Namespace.objects.get_or_create(name="acme.other")
    layout([(0, 4), (4, 8), (8, 1000)])
    for n in range(3):
        write(staff, f"{NS}/order/a", {"n": n})  # seqs 1-3
    for n in range(8):
        write(staff, "acme.other/order/b", {"n": n})  # seqs 4-11
    with CaptureQueriesContext(connection) as queries:
        found = asof.as_of_time(at=timezone.now(), namespaces=[NS])
    assert found is not None and found.seq == 3
    reads = [q["sql"] for q in queries.captured_queries if "arms(found)" in q["sql"]]
    assert len(reads) == 3  # [8, 11], [4, 7], then [0, 3]
    assert asof.as_of_time(at=timezone.now(), namespaces=["acme.other"]).seq == 11


@pytest.mark.django_db
def test_the_admins_distinct_lists_read_full_partitions_once(make_user, namespace, write):
    """The author and branch lists go a partition at a time (migration 0038): the
    same values as one scan of the whole table, and a partition the head has
    passed is read once (it never gains a row)."""
    from atlas.admin_mixins import loose_index_scan
    from changesets.admin import distinct

    layout([(0, 3), (3, 6), (6, 1000)])
    authors = [make_user(f"author{n}", maintainer=[NS]) for n in range(4)]
    for n in range(8):  # seqs 1-8 by four authors: partitions [0, 3) and [3, 6) are full
        write(authors[n % 4], f"{NS}/order/a", {"n": n})
    whole = loose_index_scan(table="changesets_changeset", columns=["author_name"])
    assert distinct.distinct_values("changesets_changeset", ["author_name"]) == whole
    assert distinct.distinct_values("changesets_changeset", ["author_name"], limit=2) == whole[:2]
    with CaptureQueriesContext(connection) as queries:
        again = distinct.distinct_values("changesets_changeset", ["author_name"])
    scans = [q["sql"] for q in queries.captured_queries if "WITH RECURSIVE" in q["sql"]]
    assert again == whole
    assert len(scans) == 1 and partitions.partition_name(6, "changesets_changeset") in scans[0]
    write(make_user("late", maintainer=[NS]), f"{NS}/order/a", {"n": 9})  # the head's partition
    assert ("late",) in distinct.distinct_values("changesets_changeset", ["author_name"])
