"""The admin's journal page reads newest first off an index, never sorting the journal
(issue 18: it sorted the whole table, spilling to disk, at a million entries)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib import admin
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from changesets.models import JournalEntry
from tests.changesets.test_publish_sets import nodes, seed_backlog

pytestmark = pytest.mark.django_db


def page_plan(user: Any, query: str = "") -> dict[str, Any]:
    request = RequestFactory().get("/admin/changesets/journalentry/" + query)
    request.user = user
    model_admin = admin.site._registry[JournalEntry]
    with CaptureQueriesContext(connection) as queries:  # the page's own statement
        model_admin.get_changelist_instance(request)
    [sql] = [
        q["sql"]
        for q in queries.captured_queries
        if 'FROM "changesets_journalentry"' in q["sql"] and "LIMIT" in q["sql"]
    ]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        raw = cursor.fetchone()[0]
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


@pytest.mark.parametrize("query", ["", "?before=25000"])
def test_the_journal_page_is_an_index_scan_in_its_order(staff, namespace, query):
    with connection.cursor() as cursor:
        # A backlog (published entries are deleted, so every entry is outstanding:
        # this is the table after a long worker outage), and a few rows an older
        # release marked published, which the page leaves out.
        seed_backlog(cursor, 50_000)
        cursor.execute(
            "UPDATE changesets_journalentry SET phase = 'published', published_at = now()"
            " WHERE seq % 1000 = 0"
        )
        cursor.execute("ANALYZE changesets_journalentry")
        cursor.execute("ANALYZE changesets_changeset")  # as autovacuum would have

    plan = page_plan(staff, query)

    kinds = [n["Node Type"] for n in nodes(plan)]
    journal_scans = [n for n in nodes(plan) if n.get("Relation Name") == "changesets_journalentry"]
    assert "Sort" not in kinds, kinds
    assert [n.get("Index Name") for n in journal_scans] == ["journal_pending"], journal_scans
