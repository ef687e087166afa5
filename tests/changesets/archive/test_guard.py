"""The log's delete guard (migration 0024): only an archive cut's removal passes.

A DELETE of a changeset or revision row passes only inside a transaction that
set ``atlas.archiving`` and only for a row at or below a signed cut that reads
already end at (state ``switched`` or ``removed``). Every other DELETE, and
every UPDATE, is refused as before.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from changesets import partitions
from changesets.archive import hot
from changesets.archive.models import ArchiveCut, ArchiveSegment, CutState, SegmentState
from changesets.models import Changeset, Revision
from tests.changesets.archive.conftest import NS_A
from tests.changesets.partition_helpers import layout

pytestmark = pytest.mark.django_db

REFUSED = "append-only"


@pytest.fixture
def log(write, make_user, publish_committed):
    root = make_user("root", superuser=True)
    make_user("maker", maintainer=[NS_A])
    for n in range(4):
        write(root, f"{NS_A}/doc/k{n}", {"n": n})
    publish_committed()
    return list(Changeset.objects.order_by("seq"))


def _cut(seq: int, state: str, *, signature: str = "c2ln") -> ArchiveCut:
    first = Changeset.objects.get(seq=seq)
    return ArchiveCut.objects.create(
        seq=seq, from_seq=1, prev_hash="0" * 64, hash=first.hash, at=first.at,
        max_changeset_id=first.id, changesets=seq, revisions=seq, state=state,
        signature=signature, location="test", requested_by="test", created_at=timezone.now(),
    )  # fmt: skip


def _delete(sql: str, params: list, *, marker: bool) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        if marker:
            cursor.execute("SET LOCAL atlas.archiving = 'on'")
        cursor.execute(sql, params)


@pytest.mark.parametrize("table", ["changesets_revision", "changesets_changeset"])
def test_a_delete_without_the_marker_is_refused_even_under_a_cut(log, table):
    _cut(2, CutState.SWITCHED)
    with pytest.raises(DatabaseError, match=REFUSED):
        _delete(f"DELETE FROM {table} WHERE seq = 1", [], marker=False)


@pytest.mark.parametrize(
    "state", [CutState.PLANNED, CutState.WRITTEN, CutState.VERIFIED, CutState.SIGNED]
)
def test_a_delete_under_a_cut_not_yet_switched_is_refused(log, state):
    _cut(2, state)
    with pytest.raises(DatabaseError, match=REFUSED):
        _delete("DELETE FROM changesets_revision WHERE seq = 1", [], marker=True)


def test_a_delete_under_an_unsigned_cut_is_refused(log):
    _cut(2, CutState.SWITCHED, signature="")
    with pytest.raises(DatabaseError, match=REFUSED):
        _delete("DELETE FROM changesets_revision WHERE seq = 1", [], marker=True)


def test_a_delete_past_the_cut_is_refused(log):
    _cut(2, CutState.SWITCHED)
    with pytest.raises(DatabaseError, match=REFUSED):
        _delete("DELETE FROM changesets_revision WHERE seq = 3", [], marker=True)
    with pytest.raises(DatabaseError, match=REFUSED):
        _delete("DELETE FROM changesets_revision WHERE seq <= 3", [], marker=True)


@pytest.mark.django_db(transaction=True)
def test_the_marker_ends_with_its_transaction(log):
    """``SET LOCAL``: a real transaction's end clears it (hence a committing test)."""
    _cut(2, CutState.SWITCHED)
    _delete("SELECT 1", [], marker=True)
    with pytest.raises(DatabaseError, match=REFUSED):
        _delete("DELETE FROM changesets_revision WHERE seq = 1", [], marker=False)


def test_an_update_is_refused_with_the_marker_and_a_cut(log):
    _cut(2, CutState.SWITCHED)
    with pytest.raises(DatabaseError, match=REFUSED):
        _delete("UPDATE changesets_changeset SET comment = 'x' WHERE seq = 1", [], marker=True)
    with pytest.raises(DatabaseError, match=REFUSED):
        _delete("UPDATE changesets_revision SET slug = 'x' WHERE seq = 1", [], marker=True)


def test_the_removal_passes_under_a_switched_signed_cut_and_only_through_it(log):
    _cut(2, CutState.SWITCHED)
    with CaptureQueriesContext(connection) as queries:
        removed = hot.remove_through(2, batch=1)
    assert removed == 2
    assert list(Changeset.objects.values_list("seq", flat=True).order_by("seq")) == [3, 4]
    assert not Revision.objects.filter(seq__lte=2).exists()
    # Both tables' partitions of seqs 0-2 were dropped whole (migration 0038): no row
    # of either went by DELETE.
    for parent in partitions.PARENTS:
        assert partitions.partitions(parent=parent)[0].lower == 3, parent
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert not [sql for sql in deletes if "changesets_changeset " in sql], deletes
    assert any(
        "DETACH PARTITION changesets_changeset_p" in q["sql"] for q in queries.captured_queries
    )
    with pytest.raises(hot.NotCovered):  # partition 3 is not dropped without a cut
        hot.remove_through(3)
    assert Revision.objects.filter(seq=3).exists()


def test_a_partition_straddling_the_cut_keeps_the_delete_guard(log):
    """Rows a partition holds on both sides of a cut go by the guarded DELETE."""
    with connection.cursor() as cursor:  # move seqs 1-4 into one partition [1, 10)
        cursor.execute("CREATE TABLE tmp_rev AS SELECT * FROM changesets_revision")
        cursor.execute("CREATE TABLE tmp_cs AS SELECT * FROM changesets_changeset")
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("TRUNCATE changesets_revision, changesets_changeset CASCADE")
    layout([(0, 1), (1, 10), (10, 100)])
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO changesets_changeset SELECT * FROM tmp_cs")
        cursor.execute("INSERT INTO changesets_revision SELECT * FROM tmp_rev")
    _cut(2, CutState.SWITCHED)
    assert hot.remove_through(2, batch=1) == 2
    assert list(Revision.objects.values_list("seq", flat=True).order_by("seq")) == [3, 4]
    assert list(Changeset.objects.values_list("seq", flat=True).order_by("seq")) == [3, 4]
    for parent in partitions.PARENTS:  # [0, 1) was empty
        assert [p.lower for p in partitions.partitions(parent=parent)] == [1, 10], parent
    with pytest.raises(DatabaseError, match=REFUSED):
        hot.remove_through(3)


def test_a_partition_is_never_dropped_before_its_segments_are_verified(log):
    cut = _cut(2, CutState.SWITCHED)
    ArchiveSegment.objects.create(
        cut=cut, name="s1", first_seq=1, last_seq=2, changesets=2, revisions=2,
        state=SegmentState.WRITTEN,
    )  # fmt: skip
    with pytest.raises(hot.NotCovered):
        hot.remove_through(2)
    assert Revision.objects.filter(seq__lte=2).count() == 2
    ArchiveSegment.objects.filter(cut=cut).update(state=SegmentState.VERIFIED)
    assert hot.remove_through(2) == 2
