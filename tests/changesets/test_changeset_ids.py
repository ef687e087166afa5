"""A changeset found by its id is planned over the partition that holds it
(``changesets.selectors.changeset_ids``), and a wrong or stale map of ids to
partitions never changes an answer.

The scale benchmark's skewed log (UUIDv7 ids made from each changeset's time,
as the write path makes them) on ten partitions of 3,000 seqs.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench import scale_populate as pop
from changesets import partitions
from changesets.models import Changeset
from changesets.selectors import changeset_ids
from changesets.selectors.changeset_ids import ClosedPartition, IdMap
from tests.changesets.partition_helpers import layout
from tests.changesets.test_partition_plans import _planned_partitions

pytestmark = pytest.mark.django_db

ROWS = 30_000
WIDTH = 3_000


@pytest.fixture
def log() -> None:
    layout(partitions.missing(0, ROWS + 1 + 2 * WIDTH, [], step=WIDTH))
    with connection.cursor() as cursor:
        pop.populate(cursor, ROWS)
        cursor.execute("ANALYZE changesets_changeset")
    changeset_ids.forget()


def _changeset(seq_near: int) -> tuple[str, int]:
    row = Changeset.objects.filter(seq__gte=seq_near).order_by("seq").values_list("id", "seq")[0]
    return str(row[0]), row[1]


def _by_id_statements(queries: Any) -> list[str]:
    return [
        q["sql"]
        for q in queries.captured_queries
        if '"changesets_changeset"."id" =' in q["sql"] and "changesets_revision" not in q["sql"]
    ]


def test_the_map_holds_the_closed_partitions_ranges(log):
    found = changeset_ids.current()
    head = partitions.log_head()
    closed = [p for p in partitions.partitions(parent=partitions.CHANGESETS) if p.last_seq <= head]
    assert [(p.lower, p.upper) for p in found.closed] == [(p.lower, p.upper) for p in closed]
    assert found.open_from == closed[-1].upper <= head + 1
    for part in found.closed:
        ids = Changeset.objects.filter(seq__gte=part.lower, seq__lt=part.upper)
        assert part.min_id == ids.order_by("id").values_list("id", flat=True)[0]
        assert part.max_id == ids.order_by("-id").values_list("id", flat=True)[0]


@pytest.mark.parametrize("where", ["old", "newest"])
def test_a_changeset_by_id_is_planned_over_its_own_partition(log, client_for, make_user, where):
    """Its API page (superuser and scoped), ``as_of=<id>`` and the admin's search by
    id: the statement that finds it by id is planned over one partition (an old
    changeset) or over the open partitions past the map's closed ones (the newest),
    where by the id alone it is planned over all of them."""
    changeset_id, seq = _changeset(ROWS // 2 if where == "old" else ROWS)
    everything = len(partitions.partitions(parent=partitions.CHANGESETS))
    most = 1 if where == "old" else everything - len(changeset_ids.current().closed)
    assert most < everything / 3
    root = make_user("root", superuser=True)
    namespace = Changeset.objects.get(pk=changeset_id, seq=seq).namespaces[0]
    pages = [
        (client_for(root), f"/api/v1/changesets/{changeset_id}"),
        (client_for(make_user("rita", reader=[namespace])), f"/api/v1/changesets/{changeset_id}"),
        (
            client_for(root),
            f"/api/v1/entities?namespace={namespace}&as_of={changeset_id}&page_size=5",
        ),
    ]
    for client, url in pages:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, (url, response.content[:300])
        statements = _by_id_statements(queries)
        assert statements, url
        for sql in statements:
            planned = _planned_partitions(sql, "changesets_changeset")
            assert 1 <= len(planned) <= most, (url, planned)
    assert response.json()["results"] is not None
    # Unmapped, the same lookup is planned over every partition.
    changeset_ids.prime()
    with CaptureQueriesContext(connection) as queries:
        client_for(root).get(f"/api/v1/changesets/{changeset_id}")
    (sql,) = _by_id_statements(queries)
    assert len(_planned_partitions(sql, "changesets_changeset")) == everything


def test_the_admin_search_by_id_reads_one_partition(log, admin_client):
    changeset_id, seq = _changeset(ROWS // 3)
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get("/admin/changesets/changeset/", {"q": changeset_id})
    assert response.status_code == 200
    assert changeset_id in response.content.decode()
    page = [q["sql"] for q in queries.captured_queries if f'"seq" = {seq}' in q["sql"]]
    assert page
    for sql in page:
        assert len(_planned_partitions(sql, "changesets_changeset")) == 1, sql


def _truth(changeset_id: Any) -> int | None:
    return Changeset.objects.filter(pk=changeset_id).values_list("seq", flat=True).first()


def test_a_wrong_map_never_changes_an_answer(log):
    """Maps that put ids in the wrong partition, that know only old partitions (stale),
    or that know nothing: every id is found with its seq, an unknown one is not, and a
    map proved wrong is dropped, so the next lookup reads it again."""
    rng = random.Random(21)
    sample = list(Changeset.objects.values_list("id", "seq"))
    picked = rng.sample(sample, 60) + [sample[0], sample[-1]]
    right = changeset_ids.current()
    shifted = IdMap(
        closed=tuple(
            ClosedPartition(p.lower + WIDTH, p.upper + WIDTH, p.min_id, p.max_id)
            for p in right.closed
        ),
        open_from=right.open_from + WIDTH,
    )
    stale = IdMap(closed=right.closed[:3], open_from=right.closed[2].upper)
    for wrong in (shifted, stale, changeset_ids.EMPTY, right):
        for changeset_id, seq in picked:
            changeset_ids.prime(wrong)
            assert changeset_ids.seq_of(changeset_id) == seq == _truth(changeset_id)
            assert changeset_ids.seq_of(str(changeset_id)) == seq
        changeset_ids.prime(wrong)
        assert changeset_ids.seq_of(uuid.uuid4()) is None
        assert changeset_ids.seq_of("not a uuid") is None
    # A lookup the map sent to the wrong place drops the map.
    changeset_ids.prime(shifted)
    changeset_ids.seq_of(picked[0][0])
    with CaptureQueriesContext(connection) as queries:
        assert changeset_ids.current() == right
    assert queries.captured_queries  # read again


def test_the_map_is_read_again_after_its_time(log, monkeypatch):
    changeset_ids.forget()
    with CaptureQueriesContext(connection) as queries:
        changeset_ids.current()
        changeset_ids.current()
    first = len(queries.captured_queries)
    assert first >= 1
    with CaptureQueriesContext(connection) as queries:
        changeset_ids.current()
    assert not queries.captured_queries  # cached
    monkeypatch.setattr(changeset_ids, "MAP_SECONDS", 0.0)
    changeset_ids.forget()
    changeset_ids.current()
    with CaptureQueriesContext(connection) as queries:
        changeset_ids.current()
    assert len(queries.captured_queries) == first


def test_no_partition_closed_means_no_bounds(db):
    """A log younger than one partition: nothing to narrow, and the lookup is the
    plain one (a statement for the map, none for bounds)."""
    changeset_ids.forget()
    assert changeset_ids.current() == changeset_ids.EMPTY
    assert changeset_ids.EMPTY.bounds(uuid.uuid4()) is None
