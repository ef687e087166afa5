"""Reads keep their plans on a partitioned revision table (issue 21, phase 2), by EXPLAIN.

The scale benchmark's skewed log (``bench/scale_populate.py``) is laid out on
ten partitions. The entity history page and the change feed page, through the
API, must read by index in every partition they touch — pruned to the
partitions a seq bound allows, or merged in index order (Merge Append, or an
ordered Append: partitions are in seq order) — never a sequential scan and
never a sort of a whole partition.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench import scale_populate as pop
from changesets import partitions
from changesets.selectors.feed import cursor_encode
from tests.changesets.partition_helpers import layout
from tests.changesets.test_time_seek import analyze, nodes

pytestmark = pytest.mark.django_db

ROWS = 30_000
WIDTH = 3_000


@pytest.fixture
def log() -> None:
    layout(partitions.missing(0, ROWS + 1 + WIDTH, [], step=WIDTH))
    with connection.cursor() as cursor:
        pop.populate(cursor, ROWS)
        cursor.execute("ANALYZE changesets_revision")
        cursor.execute("ANALYZE changesets_changeset")
    assert len(partitions.partitions()) >= 10


def _revision_statements(call: Any) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        response = call()
    assert response.status_code == 200, response.content
    return [q["sql"] for q in queries.captured_queries if "changesets_revision" in q["sql"]]


def _assert_index_reads(plan: dict[str, Any], *, page: int) -> list[str]:
    """No Seq Scan; no Sort of more rows than a page; no scan that walks a partition
    (discards half a partition's rows); the partitions scanned."""
    found = list(nodes(plan))
    types = [n["Node Type"] for n in found]
    assert "Seq Scan" not in types, types
    for node in found:
        if node["Node Type"] == "Sort":
            assert node.get("Actual Rows", 0) <= page * 2, node
        removed = node.get("Rows Removed by Filter", 0) * max(node.get("Actual Loops", 1), 1)
        assert removed <= WIDTH // 2, node
    return [n["Relation Name"] for n in found if "Relation Name" in n and "Scan" in n["Node Type"]]


def _busiest_key() -> tuple[str, str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT namespace, kind, slug FROM changesets_revision WHERE branch = ''"
            " GROUP BY 1, 2, 3 ORDER BY count(*) DESC LIMIT 1"
        )
        return cursor.fetchone()


def test_the_history_page_reads_by_index_across_partitions(log, client_for, make_user):
    client = client_for(make_user("root", superuser=True))
    namespace, kind, slug = _busiest_key()
    url = f"/api/v1/entities/{namespace}/{kind}/{slug}/history?page_size=20"
    statements = _revision_statements(lambda: client.get(url))
    assert statements
    for sql in statements:
        plan = analyze(sql)
        _assert_index_reads(plan, page=21)
        assert any(n["Node Type"] in ("Merge Append", "Append", "Limit") for n in nodes(plan)), plan


def test_the_feed_page_reads_by_index_and_prunes_to_the_cursor(log, client_for, make_user):
    client = client_for(make_user("root", superuser=True))
    since = ROWS - WIDTH // 2  # in the last full partition
    url = f"/api/v1/changes?since={cursor_encode(since)}&limit=100"
    statements = _revision_statements(lambda: client.get(url))
    assert statements
    for sql in statements:
        plan = analyze(sql)
        scanned = _assert_index_reads(plan, page=101)
        # Partitions wholly at or below the cursor are pruned or never executed.
        executed = [
            n["Relation Name"]
            for n in nodes(plan)
            if "Relation Name" in n and n.get("Actual Loops", 1) > 0
        ]
        low = [p.name for p in partitions.partitions() if p.last_seq < since]
        assert not set(executed) & set(low), (scanned, low)
