"""History pages built from rows (issue 17): the same values the models hold, and
two queries per page (its revisions, then their changesets by seq).

``changesets.selectors.rows`` reads revisions without instantiating ``Revision``
or ``Changeset`` and carries ``at`` as epoch microseconds; these tests compare
every field with what the ORM reads, so a column read wrong, a time off by a
microsecond or a timezone lost fails here.
"""

from __future__ import annotations

import re
from datetime import UTC
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from changesets.models import Revision
from changesets.selectors import entity_keys, keys
from changesets.selectors.log import entity_history
from changesets.selectors.rows import HistoryRow
from tests.changesets.helpers import assert_json_identical, key

NS = "acme.orders"
PATH = f"{NS}/order/o-1"
URL = f"/api/v1/entities/{PATH}/history"
FIELDS = (
    "id",
    "changeset_id",
    "seq",
    "branch",
    "at",
    "namespace",
    "kind",
    "slug",
    "op",
    "before_version",
    "after_version",
    "changed",
)


@pytest.fixture
def lifecycle(staff, namespace, write):
    """o-1 created, updated (nested, a float, a bool), deleted, created again."""
    write(staff, PATH, {"a": 1, "n": {"x": 1.0, "t": True}}, comment="first")
    write(staff, PATH, {"a": 2, "n": {"x": 1, "t": True}, "s": "é\u2028"})
    write(staff, PATH, None)
    write(staff, PATH, {"b": [1, None, {"c": "d"}]})


def assert_same(row: HistoryRow, revision: Revision) -> None:
    for name in FIELDS:
        assert getattr(row, name) == getattr(revision, name), name
    assert row.at.utcoffset() is not None and row.at.astimezone(UTC) == revision.changeset.at
    assert_json_identical(row.before, revision.before, what="before")
    assert_json_identical(row.after, revision.after, what="after")
    brief, changeset = row.changeset, revision.changeset
    assert (brief.id, brief.author_name, brief.at, brief.rpc, brief.comment) == (
        changeset.id,
        changeset.author_name,
        changeset.at,
        changeset.rpc,
        changeset.comment,
    )


def orm_history(**filters: Any) -> list[Revision]:
    qs = Revision.objects.filter(namespace=NS, kind="order", slug="o-1", **filters)
    return list(qs.select_related("changeset").order_by("-seq"))


def test_entity_history_rows_hold_what_the_models_hold(lifecycle):
    rows = entity_history(key=key(PATH))
    revisions = orm_history()
    assert [r.op for r in rows] == ["create", "delete", "update", "create"]
    assert len(rows) == len(revisions) == 4
    for row, revision in zip(rows, revisions, strict=True):
        assert_same(row, revision)


def test_entity_history_pages_by_seq(lifecycle):
    newest = entity_history(key=key(PATH), limit=2)
    older = entity_history(key=key(PATH), before_seq=newest[-1].seq, limit=2)
    assert [r.seq for r in newest + older] == [r.seq for r in orm_history()]


def test_key_history_rows_hold_what_the_models_hold(lifecycle):
    rows = entity_keys.entity_key_history(key=key(PATH), pointer="/n")
    expected = [r for r in orm_history() if any(p.startswith("/n") for p in r.changed)]
    assert [r.seq for r in rows] == [r.seq for r in expected] and len(rows) == 3
    for row, revision in zip(rows, expected, strict=True):
        assert_same(row, revision)
    whole = entity_keys.entity_key_history(key=key(PATH), pointer="")
    assert [r.seq for r in whole] == [r.seq for r in orm_history()]


def test_namespace_revisions_rows_hold_what_the_models_hold(lifecycle):
    rows = keys.namespace_revisions(where=keys.RevisionFilter(namespace=NS))
    for row, revision in zip(rows, orm_history(), strict=True):
        assert_same(row, revision)


def history_queries(client: Any, url: str = URL, *, results: int = 4) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content
    assert len(response.json()["results"]) == results
    return [q["sql"] for q in queries.captured_queries]


def is_page(sql: str) -> bool:
    """A page of revision rows: off the table, or off a page of its rows aliased as
    the table (``entity_keys.entity_key_history``), its changesets not joined."""
    return "FROM changesets_revision" in sql and "JOIN changesets_changeset" not in sql


def is_briefs(sql: str, seqs: int) -> bool:
    """The page's changesets, by the page's ``seqs`` seqs as a literal list: pruned
    to their partitions when planned (``changesets.selectors.rows``)."""
    found = re.search(r"FROM changesets_changeset WHERE seq = ANY\('\{([\d,]+)\}'", sql)
    return found is not None and len(found.group(1).split(",")) == seqs


def test_a_history_page_is_two_queries_after_authentication(lifecycle, staff, client_for):
    """A superuser: the token lookup (authentication), then the page and its
    changesets. The namespace check needs no query (a superuser reads everything)."""
    client = client_for(staff)
    sqls = history_queries(client)
    assert len(sqls) == 3, sqls
    assert "atlas_apitoken" in sqls[0]
    assert is_page(sqls[1]) and is_briefs(sqls[2], 4), sqls
    sqls = history_queries(client, URL + "?key=/n", results=3)
    assert len(sqls) == 3 and is_page(sqls[1]) and is_briefs(sqls[2], 3), sqls


def test_a_readers_history_page_adds_only_its_role_load(lifecycle, make_user, client_for):
    """A reader: the token lookup, the one-query role load that answers the
    visibility check (``entities.access``), then the page."""
    client = client_for(make_user("rita", reader=[NS]))
    sqls = history_queries(client)
    assert len(sqls) == 4, sqls
    assert "atlas_apitoken" in sqls[0]
    assert is_page(sqls[2]) and is_briefs(sqls[3], 4)
    assert sum(is_page(sql) for sql in sqls) == 1


def test_a_revision_whose_changeset_is_gone_is_left_out(lifecycle):
    """The page's changesets are read after its revisions (``rows.with_briefs``): one
    removed in between (an archive cut's removal) leaves its revision out, as the
    join of the two tables did, instead of failing the page."""
    from changesets.selectors.rows import SELECT_ROWS, with_briefs

    with connection.cursor() as cursor:
        cursor.execute(f"{SELECT_ROWS} ORDER BY changesets_revision.seq DESC")
        rows = [list(r) for r in cursor.fetchall()]
    assert len(with_briefs(rows)) == len(rows) == 4
    rows[0][2] = 10**12  # a seq no changeset holds
    assert [r.seq for r in with_briefs(rows)] == [r[2] for r in rows[1:]]
