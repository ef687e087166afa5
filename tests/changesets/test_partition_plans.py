"""Reads keep their plans on a partitioned revision table (issue 21, phase 2), by EXPLAIN.

The scale benchmark's skewed log (``bench/scale_populate.py``) is laid out on
ten partitions. The entity history page and the change feed page, through the
API, must read by index in every partition they touch — pruned to the
partitions a seq bound allows, or merged in index order (Merge Append, or an
ordered Append: partitions are in seq order) — never a sequential scan and
never a sort of a whole partition.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench import scale_populate as pop
from changesets import partitions
from changesets.selectors.feed import cursor_encode
from tests.changesets.partition_helpers import layout, parent_index
from tests.changesets.test_time_seek import analyze, nodes

pytestmark = pytest.mark.django_db

ROWS = 30_000
WIDTH = 3_000
# The index that finds one changeset's revisions in its partition (by its seq;
# every read's predicate names its id too).
SEEKS = {"revision_seq_entity"}


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
        _assert_reads_a_partition_at_most(plan)
        if "changesets_changeset" in sql:
            assert f'"changesets_changeset"."seq" > {since}' in sql, sql


def _assert_reads_a_partition_at_most(plan: dict[str, Any]) -> None:
    """No scan returns more rows than a partition holds: the joined changesets are
    bounded like the revisions (``rows.bound_changesets``). With the bound on the
    revisions only, a merge join read the changesets from seq 1 up to the cursor,
    every partition below it. (On partitions this small the planner may read one
    whole by a hash join: cheap, and bounded by the partition.)"""
    for node in nodes(plan):
        if "Scan" in node["Node Type"] and "Relation Name" in node:
            rows = node.get("Actual Rows", 0) * max(node.get("Actual Loops", 1), 1)
            assert rows <= WIDTH, (node["Relation Name"], rows)


def test_a_deep_revisions_page_reads_from_its_cursor(log, settings):
    """``GET /revisions?namespace=`` after a cursor in the middle of the log: by
    namespace alone, the namespace's changesets below the cursor and their
    revisions, in one statement planned over the partitions of the window below the
    cursor; filtered by author, walks of the namespace's changesets below the
    cursor (``keys._walked_revisions``), each bounded by it, and the briefs read by
    the page's seqs."""
    from changesets.selectors import by_namespace, keys

    settings.ATLAS_LOG_PARTITION_SEQS = WIDTH
    middle = ROWS // 2
    for namespace in (pop.BUSY_NS, pop.MID_NS, pop.RARE_NS):
        for author in (None,) if namespace == pop.RARE_NS else (None, pop.BUSY_AUTHOR):
            where = keys.RevisionFilter(namespace=namespace, author=author)
            with CaptureQueriesContext(connection) as queries:
                rows = keys.namespace_revisions(where=where, after=(middle, 10**12), limit=51)
            assert rows, (namespace, author)
            if author is None:
                # By namespace alone: the namespace's changesets below the cursor off
                # its own indexes, and their revisions, in one statement.
                # First within a partition's width below the cursor, planned over the
                # partitions it spans; below it only if that came up short (the rare one).
                first, *below = [q["sql"] for q in queries.captured_queries]
                assert len(_planned_partitions(first, "changesets_revision")) <= 2, first
                assert len(_planned_partitions(first, "changesets_changeset")) <= 2, first
                assert len(below) == (1 if namespace == pop.RARE_NS else 0), below
                for sql in (first, *below):
                    plan = analyze(sql)
                    _assert_reads_a_partition_at_most(plan)
                    _assert_index_reads(plan, page=51)
                continue
            *_, briefs = [q["sql"] for q in queries.captured_queries]
            walks = [q["sql"] for q in queries.captured_queries if "walk AS" in q["sql"]]
            assert walks, [q["sql"] for q in queries.captured_queries]
            for sql in walks:
                # (The author's rows are tested one by one: that is the filter's cost.)
                # Each walk of the namespace's changesets is bounded by the cursor.
                bounds = [int(n) for n in re.findall(r"\bseq < (\d+)", sql)]
                assert bounds and max(bounds) <= middle + 1, sql
                # A walk tests at most WALK_REVISIONS revisions; the changesets it read
                # them from may hold more (a batch), read by their seq: bounded alike.
                for node in nodes(analyze(sql)):
                    if "Scan" in node["Node Type"] and "Relation Name" in node:
                        read = node.get("Actual Rows", 0) * max(node.get("Actual Loops", 1), 1)
                        assert read <= 2 * by_namespace.WALK_REVISIONS, (
                            node["Relation Name"],
                            read,
                        )
            scans = [n for n in nodes(analyze(briefs)) if "Relation Name" in n]
            assert len(scans) <= 2 and sum(n["Actual Rows"] for n in scans) == len(
                {r.seq for r in rows}
            ), briefs


def _partition_of(seq: int) -> str:
    return next(p.name for p in partitions.partitions() if p.lower <= seq < p.upper)


def _executed_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The scans that ran (a partition pruned at run time shows as never executed)."""
    return [
        n
        for n in nodes(plan)
        if "Relation Name" in n and "Scan" in n["Node Type"] and n.get("Actual Loops", 1) > 0
    ]


def test_a_changesets_revisions_are_one_seek_in_its_own_partition(log, client_for, make_user):
    """Its detail, its revisions page and a list page's ops: by the changeset's seq
    as well as its id, so the one partition that holds it is read, by its seq's
    index (``revision_seq_entity``, migration 0028), and every other is pruned.
    (By ``changeset_id`` alone every partition would be scanned.)"""
    with connection.cursor() as cursor:
        # A batch in the middle of the log, in a partition of its own among ten.
        cursor.execute(
            "SELECT c.id, c.seq FROM changesets_changeset c WHERE c.branch = ''"
            " AND %s = ANY(c.namespaces) AND c.seq BETWEEN %s AND %s"
            " ORDER BY c.op_count DESC, c.seq LIMIT 1",
            [pop.BUSY_NS, ROWS // 2, ROWS // 2 + WIDTH // 2],
        )
        changeset_id, seq = cursor.fetchone()
    home = _partition_of(seq)
    client = client_for(make_user("root", superuser=True))
    scoped = client_for(make_user("rita", reader=[pop.BUSY_NS, pop.MID_NS]))
    pages = [
        (client, f"/api/v1/changesets/{changeset_id}"),
        (client, f"/api/v1/changesets/{changeset_id}/revisions"),
        (client, f"/api/v1/changesets/{changeset_id}/export"),
        (scoped, f"/api/v1/changesets/{changeset_id}"),  # counts its readable ops too
    ]
    for who, url in pages:
        statements = _revision_statements(lambda w=who, u=url: w.get(u))
        assert statements, url
        for sql in statements:
            plan = analyze(sql)
            scans = _executed_scans(plan)
            assert [n["Relation Name"] for n in scans] == [home], (url, sql)
            assert parent_index(scans[0].get("Index Name", "")) in SEEKS, (url, scans)
            _assert_index_reads(plan, page=101)


def _planned_partitions(sql: str, table: str) -> set[str]:
    """The partitions of ``table`` that ``sql``'s plan scans: those left after pruning
    when planned (one pruned at run time still shows, as never executed)."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0][0]["Plan"]
    return {
        n["Relation Name"]
        for n in nodes(plan)
        if n.get("Relation Name", "").startswith(f"{table}_p")
    }


def test_a_list_pages_ops_read_only_the_partitions_of_its_changesets(log, client_for, make_user):
    """Each changeset's first ops (a LATERAL subquery per changeset) and the scoped
    reader's op counts: pruned to the page's partitions when planned."""
    for who in (make_user("root", superuser=True), make_user("rita", reader=[pop.MID_NS])):
        client = client_for(who)
        # The second page: the newest changeset sits alone in the partition ahead of
        # the head, where one row is cheapest read without an index.
        token = client.get("/api/v1/changesets?page_size=20").json()["next_page_token"]
        url = f"/api/v1/changesets?page_size=20&page_token={token}"
        statements = _revision_statements(lambda c=client, u=url: c.get(u))
        assert statements
        for sql in statements:
            plan = analyze(sql)
            scans = _executed_scans(plan)
            assert scans, sql
            assert {parent_index(n["Index Name"]) for n in scans} <= SEEKS, scans
            # The page's changesets are among the newest: one or two partitions of ten,
            # pruned when planned (the page's seqs are literals in each statement).
            assert len({n["Relation Name"] for n in scans}) <= 2, scans
            assert len(_planned_partitions(sql, "changesets_revision")) <= 2, sql
            for node in scans:
                removed = node.get("Rows Removed by Filter", 0) * node.get("Actual Loops", 1)
                assert removed <= 100, node


@pytest.mark.parametrize("readers", [[pop.MID_NS, pop.RARE_NS], [pop.RARE_NS]])
def test_a_scoped_list_page_is_planned_over_the_newest_partitions_first(log, settings, readers):
    """A page merged from a reader's namespaces (up to five scans of the changeset
    table) is read first within a partition's width of seqs below the head, so its
    statement is planned over at most two partitions; only a page that window
    cannot fill (the rare namespace's six changesets in 30,000) is read again below
    it. Either way it is the reader's newest changesets, every page in turn."""
    from changesets.models import Changeset
    from changesets.selectors.log import changeset_list

    settings.ATLAS_LOG_PARTITION_SEQS = WIDTH
    visible = Changeset.objects.filter(namespaces__overlap=readers).order_by("-seq")
    expected = list(visible.values_list("seq", flat=True))
    found: list[int] = []
    before = None
    while True:
        with CaptureQueriesContext(connection) as queries:
            page = changeset_list(namespaces=readers, before_seq=before, limit=20)
        found += [c.seq for c in page]
        unions = [q["sql"] for q in queries.captured_queries if "UNION" in q["sql"]]
        assert unions, queries.captured_queries
        assert len(_planned_partitions(unions[0], "changesets_changeset")) <= 2, unions[0]
        # A second statement only when the window came up short.
        assert len(unions) == 1 or len([s for s in found if s > (before or 10**9)]) < 20
        if len(page) < 20:
            break
        before = page[-1].seq
    assert found == expected


def test_the_admin_search_reads_a_partition_at_a_time(log):
    """Search by slug (``changesets.admin.search.candidates``): the partition holding
    the cursor, then the one below, each planned over that partition alone (each
    prefix's index read backwards, cut at the limit), and only then the rest; the
    pages are the entity's revisions newest first, as one statement over all gives."""
    from atlas.admin_keyset import BEFORE
    from changesets.admin import search

    _namespace, _kind, slug = _busiest_key()
    slug, combos = search.entity_prefixes(slug, readable=None)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, id FROM changesets_revision WHERE slug = %s ORDER BY seq DESC, id DESC",
            [slug],
        )
        expected = cursor.fetchall()
    found: list[tuple[int, int]] = []
    after = None
    while True:
        with CaptureQueriesContext(connection) as queries:
            batch = search.candidates(slug, combos, direction=BEFORE, after=after, limit=100)
        found += [(c.seq, c.id) for c in batch]
        reads = [q["sql"] for q in queries.captured_queries if "LATERAL" in q["sql"]]
        for sql in reads[: search.WINDOWS]:
            assert len(_planned_partitions(sql, "changesets_revision")) == 1, sql
        if len(batch) < 100:
            break
        after = found[-1]
    assert found == expected


def test_blame_plans_its_window_over_the_newest_partitions(log, settings):
    """Blame's first statement, the window of the busy entity's newest revisions, is
    read from a partition's width of seqs below the log head, as literals, so it is
    planned over the one or two partitions that width spans, not over all eleven
    (then below it, if the entity's revisions there were fewer than a window);
    the answer is still each leaf's newest revision that touched it."""
    from changesets import pointers
    from changesets.selectors import blame, entity_keys
    from changesets.selectors.keys import touching
    from entities.store import EntityKey, baseline

    settings.ATLAS_LOG_PARTITION_SEQS = WIDTH
    key = EntityKey(*_busiest_key())
    entity = baseline.get(key)
    assert entity is not None
    with CaptureQueriesContext(connection) as queries:
        found = blame.blame(content=entity.content, key=key)
    windows = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("WITH win")]
    assert len(_planned_partitions(windows[0], "changesets_revision")) <= 2, windows[0]
    # A second window, below that width, only when the first came up short.
    with connection.cursor() as cursor:
        cursor.execute(windows[0])
        size = cursor.fetchone()[0]
    assert len(windows) == (1 if size >= entity_keys.ENTITY_KEY_WINDOW else 2), (size, windows)
    expected = {}
    with connection.cursor() as cursor:
        for leaf in pointers.leaves(entity.content):
            rule, args = touching([leaf])
            cursor.execute(
                "SELECT seq FROM changesets_revision WHERE branch = '' AND namespace = %s"
                f" AND kind = %s AND slug = %s AND {rule} ORDER BY seq DESC LIMIT 1",
                [key.namespace, key.kind, key.slug, *args],
            )
            expected[leaf] = cursor.fetchone()[0]
    assert {entry.pointer: entry.seq for entry in found} == expected
    assert len(expected) > 1


@pytest.mark.parametrize("namespace", [pop.BUSY_NS, pop.MID_NS, pop.RARE_NS])
def test_a_namespaces_revisions_by_its_changesets_are_every_revision_in_order(
    log, settings, namespace
):
    """``GET /revisions?namespace=`` by namespace (and time) alone reads the
    namespace's changesets off their own indexes and their revisions in it
    (``keys._by_changesets``), a partition's width below its top first: paged
    through, on baseline and a branch, with and without a time window, it is
    every revision of the namespace newest first, (seq, id) order, as one
    filtered statement over the table gives it."""
    from changesets.models import Revision
    from changesets.selectors import keys

    settings.ATLAS_LOG_PARTITION_SEQS = WIDTH
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(at), max(at) FROM changesets_changeset WHERE seq BETWEEN %s AND %s",
            [ROWS // 3, ROWS // 3 * 2],
        )
        since, until = cursor.fetchone()
    for branch in ("", pop.BRANCH):
        for window in ({}, {"since": since, "until": until}):
            where = keys.RevisionFilter(namespace=namespace, **window)
            expected_qs = Revision.objects.filter(branch=branch, namespace=namespace)
            if window:
                expected_qs = expected_qs.filter(at__gte=since, at__lte=until)
            expected = list(expected_qs.order_by("-seq", "-id").values_list("seq", "id"))
            found: list[tuple[int, int]] = []
            after = None
            for _ in range(1000):
                page = keys.namespace_revisions(where=where, branch=branch, after=after, limit=97)
                found += [(r.seq, r.id) for r in page]
                if len(page) < 97:
                    break
                after = found[-1]
            assert found == expected, (branch, window)
            assert expected or (branch and namespace != pop.BUSY_NS), (namespace, branch)
