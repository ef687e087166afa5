"""The plans that keep every page flat as the log grows (issue 18), pinned by EXPLAIN.

A skewed log is seeded in SQL by the scale benchmark's own generator
(``bench/scale_populate.py``: 20 namespaces, one with half the log; 30
authors, one with 37%; a rare rpc at 0.01%; 2% on branches): 60,000
changesets, enough that a walk of the log costs tens of thousands of rows
where a seek costs tens. EXPLAIN ANALYZE is the evidence: no sequential
scan, no sort of the log, and few rows read or discarded. A migration that
loses ``changeset_rare_rpc``, or a change that brings back OFFSET paging, a
filtered walk for a rare rpc or the scoped namespace plan, fails here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib import admin
from django.db import connection, transaction
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import resolve

from bench import scale_populate as pop
from changesets import pointers
from changesets.admin import search
from changesets.models import Changeset, Revision
from changesets.selectors import asof, by_namespace, entity_keys, key_ladder, keys
from changesets.selectors.log import changeset_list
from entities.store import EntityKey
from tests.changesets.partition_helpers import parent_index
from tests.changesets.test_time_seek import (
    BRIEFS,
    analyze,
    assert_seek,
    nodes,
    only_sql,
)

pytestmark = pytest.mark.django_db

ROWS = 60_000
SCOPED = [pop.MID_NS, pop.RARE_NS]
READERS = [None, SCOPED]
NAMESPACE_INDEXES = {"changeset_ns1_seq", "changeset_ns2_seq", "changeset_ns3_more"}


@pytest.fixture(scope="module")
def seeded_log(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The skewed log, seeded once for the module inside a transaction that is
    rolled back when the module ends: each test runs in a savepoint of it (its
    ``django_db`` atomic block nests), so the rows, the partitions and the
    statistics below are gone afterwards, as a per-test seed's were. Seeding was
    most of this module's time (about 11 s a test)."""
    with django_db_blocker.unblock(), transaction.atomic():
        with connection.cursor() as cursor:
            pop.populate(cursor, ROWS)
            # Statistics from every row, not ANALYZE's random sample of 30,000 (300 ×
            # the default target): with a sample the plans differed from run to run (a
            # scoped branch page ANDed her namespaces' GIN bitmap with the branch index
            # in one CI run in several), so a plan test would pass or fail by chance.
            cursor.execute("SET LOCAL default_statistics_target = 1000")
            for table in ("changesets_changeset", "changesets_revision", "changesets_journalentry"):
                cursor.execute(f"ANALYZE {table}")
            cursor.execute("RESET default_statistics_target")
        try:
            yield
        finally:
            transaction.set_rollback(True)


@pytest.fixture
def log(seeded_log: None) -> None:
    """The module's seeded log (:func:`seeded_log`), for a test that reads it."""


def indexes(plan: dict[str, Any]) -> set[str]:
    """The indexes a plan reads, by the revision table's names (not its partitions')."""
    return {parent_index(n["Index Name"]) for n in nodes(plan) if "Index Name" in n}


def shape(plan: dict[str, Any]) -> list[tuple[str, str]]:
    return [(n["Node Type"], n.get("Index Name", "")) for n in nodes(plan)]


def backward(plan: dict[str, Any], index: str) -> bool:
    """Whether the plan reads ``index`` newest first."""
    return any(
        "Index Name" in n
        and parent_index(n["Index Name"]) == index
        and n.get("Scan Direction") == "Backward"
        for n in nodes(plan)
    )


def assert_merged(plan: dict[str, Any], page: int = 51) -> None:
    """A page from ordered arms (``by_namespace.newest_touching``): an Append of
    arms, each cut at the page, so nothing above them sorts more than a page per
    arm and no arm's ordered scan returns more than a page."""
    found = list(nodes(plan))
    # The outermost Append joins the arms (each arm may be an Append of its
    # partitions' scans, the changeset table being partitioned: migration 0038).
    append = next(n for n in found if n["Node Type"] == "Append")
    arms = len(append["Plans"])
    for node in found:
        if node["Node Type"] in ("Sort", "Aggregate", "Unique"):
            assert node["Plans"][0]["Actual Rows"] <= arms * page, shape(plan)
        if node["Node Type"] == "Index Scan":
            assert node["Actual Rows"] <= page, shape(plan)


def brute(namespaces: list[str] | None, **filters: Any) -> list[int]:
    qs = Changeset.objects.filter(**filters)
    if namespaces is not None:
        qs = qs.filter(namespaces__overlap=namespaces)
    return list(qs.order_by("-seq").values_list("seq", flat=True)[:51])


# (One seeded log per module, the cases looped inside each test.)


def test_a_rare_rpc_filter_is_a_seek_on_its_partial_index(log):
    for namespaces in READERS:
        for extra in ({}, {"namespace": pop.MID_NS}, {"branch": ""}):
            rows, sql = only_sql(
                lambda ns=namespaces, x=extra: changeset_list(
                    namespaces=ns, rpc=pop.RARE_RPC, limit=51, **x
                )
            )
            where = {"branch": extra["branch"]} if "branch" in extra else {}
            if "namespace" in extra:
                where["namespaces__contains"] = [extra["namespace"]]
            assert [r.seq for r in rows] == brute(namespaces, rpc=pop.RARE_RPC, **where)
            plan = analyze(sql)
            assert "changeset_rare_rpc" in indexes(plan), (extra, shape(plan))
            # Never ANDed with a bitmap of every readable changeset.
            assert not indexes(plan) & NAMESPACE_INDEXES, (extra, shape(plan))
            assert_seek(plan, most=200)


def test_a_scoped_page_bounded_by_time_is_merged_from_ordered_arms(log):
    """``since`` long ago (most of the log) or ``until`` long ago, for a reader of a
    3% namespace: the bounds are resolved to seqs first and reach the page as
    literals (``bounds.page_bounds``). As subqueries the planner guessed each at a
    third of the table, and read and sorted every row of an arm's range (4,137 at
    a million changesets) instead of reading it backwards to a page."""
    from datetime import timedelta

    first, last = Changeset.objects.order_by("seq").values_list("at", flat=True)[:: ROWS - 1]
    old = first + (last - first) / 50
    for bound in ({"since": old}, {"until": old}, {"since": old, "until": last - timedelta(1)}):
        rows, sql = only_sql(lambda b=bound: changeset_list(namespaces=SCOPED, limit=51, **b))
        where = {"at__gte": old} if "since" in bound else {}
        if "until" in bound:
            where["at__lte"] = bound["until"]
        assert [r.seq for r in rows] == brute(SCOPED, **where), bound
        assert f"seq >= {Changeset.objects.filter(at__gte=old).order_by('seq')[0].seq}" in sql or (
            "since" not in bound
        )
        assert_merged(analyze(sql))


def test_a_branch_filter_seeks_its_partial_index_and_baseline_walks_the_seq_index(log):
    """``changeset_branch_seq`` holds branch changesets only (migration 0028): a named
    branch's page is a backward seek there; baseline's (98% of this log) reads the seq
    index backwards and skips the branch rows it meets, a page and a few more."""
    for namespaces in READERS:
        for branch in (pop.BRANCH, ""):
            rows, sql = only_sql(
                lambda ns=namespaces, b=branch: changeset_list(namespaces=ns, branch=b, limit=51)
            )
            assert [r.seq for r in rows] == brute(namespaces, branch=branch), branch
            plan = analyze(sql)
            if branch:
                assert "changeset_branch_seq" in indexes(plan), shape(plan)
                # Never ANDed with a bitmap of every readable changeset (one CI run
                # in several planned that): the visibility test is written so that
                # no namespace index can serve it (``visible_changesets``).
                assert not indexes(plan) & NAMESPACE_INDEXES, shape(plan)
                if namespaces is not None:
                    assert '"namespaces")::text[] &&' in sql, sql
            elif namespaces is None:
                assert len(rows) == 51
                assert indexes(plan) == {"changesets_changeset_seq_key"}, shape(plan)
                assert backward(plan, "changesets_changeset_seq_key"), shape(plan)
                assert "Sort" not in [n["Node Type"] for n in nodes(plan)], shape(plan)
            else:
                # Her namespaces' arms, merged newest first (``by_namespace``).
                assert len(rows) == 51
                assert_merged(plan)
            # The scoped reader's 3% of the log: ~1,700 rows for a page, never the log.
            assert_seek(plan, most=100 if namespaces is None else 3_000)


def test_a_scoped_namespace_filter_plans_like_the_superusers(log):
    for filters in ({"author": pop.BUSY_AUTHOR}, {"rpc": pop.COMMON_RPC}, {}):
        plans = []
        for namespaces in READERS:
            rows, sql = only_sql(
                lambda ns=namespaces, f=filters: changeset_list(
                    namespaces=ns, namespace=pop.MID_NS, limit=51, **f
                )
            )
            plans.append(analyze(sql))
            assert rows, filters
        assert shape(plans[0]) == shape(plans[1]), filters
        if not filters:
            assert_merged(plans[1])
        else:  # a filter of the namespace: a sort of a few rows at most, never of it all
            for node in nodes(plans[1]):
                if node["Node Type"] == "Sort":
                    assert node["Plans"][0]["Actual Rows"] <= 1_000, shape(plans[1])
            # The seq index read back until a page passes both (0.7% of the log
            # for the PutEntity page: ~7,300 rows at any size), not the log.
            assert_seek(plans[1], most=10_000)


def test_an_rpc_or_author_page_of_a_scoped_reader_is_not_merged_from_her_namespaces(log):
    """Every changeset at position 2 is a batch in this log: merged arms for a
    PutEntity page read her namespace's every one of them (42,015 at ten million,
    125 ms) to find none. With an rpc or an author her namespaces are a filter on
    the seq index's walk, as before migration 0037."""
    for filters in ({"rpc": pop.COMMON_RPC}, {"author": pop.BUSY_AUTHOR}):
        rows, sql = only_sql(lambda f=filters: changeset_list(namespaces=SCOPED, limit=51, **f))
        where = {"rpc": pop.COMMON_RPC} if "rpc" in filters else {"author_name": pop.BUSY_AUTHOR}
        assert [r.seq for r in rows] == brute(SCOPED, **where), filters
        plan = analyze(sql)
        assert not indexes(plan) & {"changeset_ns2_seq"}, shape(plan)
        assert_seek(plan, most=10_000)  # (the page's share, as above)


def test_a_namespace_page_is_a_union_of_its_position_indexes_newest_first(log):
    """A namespace's page (or a scoped reader's whole list) is the union of
    per-position arms, each an ordered scan that stops at a page: a rare namespace
    (0.02%) reads its own few rows, never a bitmap of its every changeset sorted
    (the GIN index before migration 0037) or a walk of the log."""
    for namespace in (pop.RARE_NS, pop.MID_NS, pop.BUSY_NS):
        for namespaces in READERS:
            if namespaces is not None and namespace not in namespaces:
                continue
            rows, sql = only_sql(
                lambda ns=namespaces, n=namespace: changeset_list(
                    namespaces=ns, namespace=n, limit=51
                )
            )
            assert [r.seq for r in rows] == brute([namespace]), namespace
            plan = analyze(sql)
            assert_merged(plan)
            if namespace == pop.RARE_NS:
                assert "changesets_changeset_seq_key" not in indexes(plan), shape(plan)
                assert_seek(plan, most=51)
            else:  # a busy one's arm may read the seq index back: a page and the rest
                assert_seek(plan, most=3_000)
    rows, sql = only_sql(lambda: changeset_list(namespaces=SCOPED, limit=51))
    assert [r.seq for r in rows] == brute(SCOPED)
    assert_merged(analyze(sql))


def test_the_planner_knows_each_namespaces_share_at_each_position(log):
    """A position arm asks for the name's hash and the name: without the statistics
    that tie them (``changeset_ns1_stats``, ``changeset_ns2_stats``, migration 0037)
    the planner multiplied the two shares, expected a row where there were
    hundreds, and read a rare namespace's every changeset as a sorted bitmap. With
    an MCV list in them it did the same for names outside the list."""
    if connection.pg_version < 140000:
        pytest.skip("expression statistics are PostgreSQL 14's")
    with connection.cursor() as cursor:
        # Lists of 10 values at most: the rare namespaces fall outside them, as
        # they do in a log of many namespaces.
        cursor.execute("SET LOCAL default_statistics_target = 10")
        cursor.execute("ANALYZE changesets_changeset")
        cursor.execute("RESET default_statistics_target")
    for namespace in (pop.RARE_NS, pop.MID_NS, pop.BUSY_NS, "scale.ns01"):
        for position in range(by_namespace.POSITIONS):
            qs = Changeset.objects.filter(by_namespace.at_position(position, [namespace]))
            actual = qs.count()
            sql, params = qs.query.sql_with_params()
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
                raw = cursor.fetchone()[0]
            expected = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]["Plan Rows"]
            # Never the product of the two shares: at most 3 times too few.
            assert expected >= actual / 3, (namespace, position, actual, expected)


def test_a_scoped_as_of_listing_of_a_namespace_plans_like_the_superusers(log):
    """With her namespaces as well as the one asked for, the planner could not
    read the listing's index in key order and sorted the namespace's every key
    before the page (3,985 for 83 at ten million changesets): a readable
    namespace is the whole visibility test (``entities.store.entity_filters``)."""
    seq = Changeset.objects.order_by("-seq").values_list("seq", flat=True)[ROWS // 2]
    plans = []
    for namespaces in READERS:
        with CaptureQueriesContext(connection) as queries:
            rows = asof.entities_as_of(
                seq=seq, namespaces=namespaces, namespace=pop.MID_NS, limit=50
            )
        assert len(rows) == 50
        plans.append(analyze(queries.captured_queries[-1]["sql"]))
    assert shape(plans[0]) == shape(plans[1])
    for node in nodes(plans[1]):
        if node["Node Type"] == "Sort":
            assert node["Plans"][0]["Actual Rows"] <= 200, shape(plans[1])
    assert asof.entities_as_of(seq=seq, namespaces=[pop.RARE_NS], namespace=pop.MID_NS) == []


# --- the admin --------------------------------------------------------------------------------


def admin_statement(user: Any, query: str) -> str:
    """The changelist's own read of the log (the statement with its LIMIT)."""
    request = RequestFactory().get("/admin/changesets/changeset/" + query)
    request.user = user
    request.resolver_match = resolve("/admin/changesets/changeset/")
    with CaptureQueriesContext(connection) as queries:
        admin.site._registry[Changeset].get_changelist_instance(request)
    reads = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT")
        and 'FROM "changesets_changeset"' in q["sql"]
        and "LIMIT 51" in q["sql"]
    ]
    assert len(reads) == 1, [q["sql"] for q in queries.captured_queries]
    return reads[0]


@pytest.fixture
def scoped(log, make_user):
    return make_user("rita", staff=True, reader=SCOPED)


ADMIN_QUERIES = [
    "",
    f"?before={ROWS // 50}",  # a page 98% back: no OFFSET
    f"?rpc__exact={pop.RARE_RPC}",
    f"?author={pop.TINY_AUTHOR}",
    f"?branch={pop.BRANCH}",
    "?branch=~baseline",  # the seq index backwards (changeset_branch_seq is branches only)
    "?until=2024-01-08",  # an old day: one seek, then the seq index from there
    f"?namespace={pop.MID_NS}&author={pop.BUSY_AUTHOR}",  # no sort for the scoped reader
    f"?namespace={pop.MID_NS}&rpc__exact={pop.RARE_RPC}",
]


@pytest.mark.parametrize("who", ["root", "rita"])
def test_admin_changelist_pages_are_seeks(log, staff, scoped, who):
    user = staff if who == "root" else scoped
    for query in ADMIN_QUERIES:
        plan = analyze(admin_statement(user, query))
        # A sort only of a few rows (a tiny author's), never of a namespace or the log.
        for node in nodes(plan):
            if node["Node Type"] == "Sort":
                assert node["Plans"][0]["Actual Rows"] <= 1_000, (query, shape(plan))
        if "rpc__exact" in query:  # a rare rpc drives from its index, scoped or not
            assert "changeset_rare_rpc" in indexes(plan), (query, shape(plan))
            assert not indexes(plan) & NAMESPACE_INDEXES, (query, shape(plan))
        if query == f"?branch={pop.BRANCH}":
            assert "changeset_branch_seq" in indexes(plan), (query, shape(plan))
        if query == "?branch=~baseline":
            assert "changeset_branch_seq" not in indexes(plan), (query, shape(plan))
            assert backward(plan, "changesets_changeset_seq_key"), (query, shape(plan))
        # Busy filters read the seq index backwards and discard what does not
        # match: bounded by the filters' share, not by the log. The rarest here,
        # a 3% namespace by a 37% author (1.1%), reads ~4,600 rows for a page of
        # 51; a walk of the log would read all 60,000.
        assert_seek(plan, most=6_000)


def test_admin_branch_choices_are_seeks_on_the_branch_index(log, staff):
    """The superuser's branch filter lists baseline and the branches: a loose index scan
    of ``changeset_branch_seq`` (branch changesets only), never a walk of the log."""
    request = RequestFactory().get("/admin/changesets/changeset/")
    request.user = staff
    request.resolver_match = resolve("/admin/changesets/changeset/")
    with CaptureQueriesContext(connection) as queries:
        changelist = admin.site._registry[Changeset].get_changelist_instance(request)
    [branch_filter] = [
        f for f in changelist.filter_specs if getattr(f, "parameter_name", "") == "branch"
    ]
    choices = [c["display"] for c in branch_filter.choices(changelist)][1:]  # (after "All")
    expected = sorted(set(Changeset.objects.exclude(branch="").values_list("branch", flat=True)))
    assert choices == ["baseline", *expected]
    reads = [q["sql"] for q in queries.captured_queries if "branch" in q["sql"]]
    assert reads, [q["sql"] for q in queries.captured_queries]
    for sql in reads:
        plan = analyze(sql)
        assert_seek(plan, most=200)
        assert "Sort" not in [n["Node Type"] for n in nodes(plan)], shape(plan)


def test_admin_search_by_a_busy_slug_reads_a_bounded_number_of_entries(log, monkeypatch):
    slug, combos = search.entity_prefixes("obj-0", readable=None)
    with CaptureQueriesContext(connection) as queries:
        found = search.candidates(slug, combos, direction="before", after=None, limit=100)
    assert len(found) == 100
    assert [c.seq for c in found] == sorted((c.seq for c in found), reverse=True)
    plan = analyze(queries.captured_queries[-1]["sql"])
    # (a seek of each triple's key on ``revision_key``, migration 0041)
    assert indexes(plan) == {"revision_key"}, shape(plan)
    # Each prefix's range scan stops at the page's size: at most CHUNK per prefix.
    assert_seek(plan, most=len(combos) * 100)
    older = search.candidates(
        slug, combos, direction="before", after=(found[-1].seq, found[-1].id), limit=100
    )
    assert older and max(c.seq for c in older) <= found[-1].seq


def test_admin_scoped_namespace_filter_plans_like_the_superusers(log, staff, scoped):
    for extra in (f"&author={pop.BUSY_AUTHOR}", f"&rpc__exact={pop.COMMON_RPC}", ""):
        query = f"?namespace={pop.MID_NS}{extra}"
        plans = [analyze(admin_statement(user, query)) for user in (staff, scoped)]
        assert shape(plans[0]) == shape(plans[1]), query


# --- GET /revisions?namespace=&key= -----------------------------------------------------------


def brute_key(namespace: str, key: str, after: tuple[int, int] | None = None) -> list[int]:
    """The key rule by its definition, over every revision of the namespace."""
    rows = Revision.objects.filter(branch="", namespace=namespace).values_list(
        "seq", "id", "changed"
    )
    hits = sorted(
        (
            (seq, rid)
            for seq, rid, changed in rows
            if any(pointers.relates(p, key) for p in changed)
        ),
        reverse=True,
    )
    if after is not None:
        hits = [h for h in hits if h < after]
    return [rid for _, rid in hits[:51]]


KEY_CASES = [
    (pop.BUSY_NS, "/n"),  # changed by every revision: the walk fills the page
    (pop.BUSY_NS, "/name"),  # set by creates only, none in the window: the posting list
    (pop.BUSY_NS, "/tags/0"),  # inside an array member set by creates
    (pop.MID_NS, "/n"),  # 3% of the log: 150 rows in the window
    (pop.MID_NS, "/price"),
    (pop.RARE_NS, "/name"),  # a handful in all: the window finds none, the list the rest
    (pop.BUSY_NS, "/nothing"),  # matches nothing: both arms run dry
]


def key_page_sqls(namespace: str, key: str) -> tuple[Any, list[str]]:
    """A key-filtered page of ``namespace`` and the statements that found it: the
    walk of the namespace, then the ladder's rungs if it came up short (not the
    log head's read, nor the changesets' by the page's seqs)."""
    with CaptureQueriesContext(connection) as queries:
        rows = keys.namespace_revisions(
            where=keys.RevisionFilter(namespace=namespace, key=key), limit=51
        )
    sqls = [q["sql"] for q in queries.captured_queries]
    sqls = [s for s in sqls if not s.startswith(('SELECT "changesets_loghead"', BRIEFS))]
    assert sqls and sqls[0].startswith("WITH cs AS MATERIALIZED"), sqls
    return rows, sqls


def test_a_key_filtered_revisions_page_walks_the_window_then_reads_the_keys_own_revisions(log):
    for namespace, key in KEY_CASES:
        rows, sqls = key_page_sqls(namespace, key)
        assert [r.id for r in rows] == brute_key(namespace, key), (namespace, key)
        for sql in sqls:
            check_key_page_plan(namespace, key, sql)


def check_key_page_plan(namespace: str, key: str, sql: str) -> None:
    """The plan of one statement of a key-filtered page reads no more than its rows."""
    plan = analyze(sql)
    found = list(nodes(plan))
    # (A Seq Scan that read nothing is an empty partition ahead of the log head.)
    walks = [n for n in found if n["Node Type"] == "Seq Scan"
             and (n.get("Actual Rows", 0) or n.get("Rows Removed by Filter", 0))]  # fmt: skip
    assert not walks, (key, shape(plan))
    # Only the key's posting list is read as a bitmap: never a bitmap of the
    # namespace's revisions or of the log below the window ANDed into it.
    # (Index names through pg_partition_root: plans name the partitions' own.)
    bitmaps = {
        parent_index(n["Index Name"]) for n in found if n["Node Type"] == "Bitmap Index Scan"
    }
    # (Of revisions: the namespace walk's changesets come off the changeset
    # table's position indexes, as a page of them does. And the namespace's
    # creates and deletes for the images' walk, which the planner reads whole and
    # sorts while they are few: 2,350 at 100k changesets in the scale bench's
    # busy namespace; at 1M and 10M, off the index newest first.)
    of_revisions = {b for b in bitmaps if b.startswith("revision")}
    assert of_revisions <= {"revision_changed_keys", "revision_images"}, (key, shape(plan))
    # (no range of an index led by branch and namespace: every entry of the namespace)
    assert not indexes(plan) & {"revision_creates", "revision_deletes"}, (key, shape(plan))
    for node in found:
        index = parent_index(node["Index Name"]) if "Index Name" in node else ""
        if index == "revision_seq_entity" and "Scan" in node["Node Type"]:
            # The walk: the window's revisions at most (the bound's own count
            # back along the index is an index-only scan of as many entries).
            assert node.get("Rows Removed by Filter", 0) <= key_ladder.KEY_WINDOW + 1, node
            assert node["Actual Rows"] <= key_ladder.KEY_WINDOW + 1, node
    # What the posting list fetches is the key's own revisions, no more.
    total = (
        Revision.objects.filter(branch="", namespace=namespace)
        .filter(keys.key_filter(branch="", namespace=namespace, key=key))
        .count()
    )
    for node in found:
        if node["Node Type"] == "Bitmap Heap Scan" and any(
            "Index Name" in n and parent_index(n["Index Name"]) == "revision_changed_keys"
            for n in nodes(node)
        ):
            assert node["Actual Rows"] + node.get("Rows Removed by Filter", 0) <= total, node
        if "Index Name" in node and parent_index(node["Index Name"]).startswith("changeset_ns"):
            # The namespace's walk: its newest changesets, a walk's worth at most.
            assert node["Actual Rows"] <= by_namespace.WALK_CHANGESETS, node


@pytest.mark.parametrize("probe", [20_000, 500], ids=["posting-list", "walk-on"])
def test_key_filtered_revisions_page_across_the_window_in_order(log, monkeypatch, probe):
    # A window that ends inside the first pages; with a probe of 500 a key with
    # more matches than that below the window is walked for, else read off its list.
    monkeypatch.setattr(key_ladder, "KEY_WINDOW", 300)
    monkeypatch.setattr(key_ladder, "KEY_PROBE", probe)
    for namespace, key in [(pop.BUSY_NS, "/n"), (pop.MID_NS, "/n"), (pop.BUSY_NS, "/name")]:
        after = None
        for _ in range(4):
            rows = keys.namespace_revisions(
                where=keys.RevisionFilter(namespace=namespace, key=key), after=after, limit=51
            )
            assert [r.id for r in rows] == brute_key(namespace, key, after), (key, after)
            if len(rows) < 51:
                break
            after = (rows[-1].seq, rows[-1].id)


def brute_entity_key(namespace: str, key: str, before: int | None = None) -> list[int]:
    """The seqs of ``obj-0``'s revisions that touched ``key``, by the rule's definition."""
    rows = Revision.objects.filter(
        branch="", namespace=namespace, kind="item", slug="obj-0"
    ).values_list("seq", "changed")
    hits = sorted(
        (s for s, changed in rows if any(pointers.relates(p, key) for p in changed)), reverse=True
    )
    return [s for s in hits if before is None or s < before][:51]


ENTITY_KEY_CASES = [
    (pop.BUSY_NS, "/price"),  # every revision: the walk fills the page
    (pop.MID_NS, "/price"),  # the same, in a namespace whose posting list looks narrow
    (pop.MID_NS, "/name"),  # the create only: the window misses, the posting list has it
    (pop.BUSY_NS, "/nothing"),  # both arms run dry
]


def test_a_busy_entitys_key_history_walks_its_newest_revisions_then_the_keys_own(log):
    # Written as one filtered statement, MID_NS's busy entity was read as a BitmapAnd
    # of its history and the key's posting list: every revision of the entity read,
    # joined to its changeset and sorted for a page of 51 (249 ms at 10M changesets).
    # Now the page's changesets are read by their seqs, after the page; and the probe
    # below the walk is a statement of its own, sent only when the walk came up short.
    for namespace, key in ENTITY_KEY_CASES:
        entity = EntityKey(namespace, "item", "obj-0")
        with CaptureQueriesContext(connection) as queries:
            rows = entity_keys.entity_key_history(key=entity, pointer=key, limit=51)
        sqls = [q["sql"] for q in queries.captured_queries]
        briefs = [sql for sql in sqls if sql.startswith(BRIEFS)]
        pages = [sql for sql in sqls if not sql.startswith(BRIEFS)]
        assert 1 <= len(pages) <= 2 and len(briefs) <= 1, sqls
        assert [r.seq for r in rows] == brute_entity_key(namespace, key), (namespace, key)
        for sql in briefs:  # the page's changesets, no more
            read = sum(
                n.get("Actual Rows", 0) for n in nodes(analyze(sql)) if "Scan" in n["Node Type"]
            )
            assert read == len(rows), (key, sql)
        for plan in [analyze(sql) for sql in pages]:
            _assert_reads_about_a_window(plan, key)


def _assert_reads_about_a_window(plan: dict[str, Any], key: str) -> None:
    """No changeset read, no sort of more than a page, no scan of more than a
    window and a page."""
    for node in nodes(plan):
        if not node.get("Actual Loops"):
            continue
        read = node["Actual Rows"] * node["Actual Loops"]
        assert node.get("Relation Name") != "changesets_changeset", (key, shape(plan))
        if node["Node Type"] == "Sort":
            [sorted_] = [n for n in node["Plans"] if n["Parent Relationship"] == "Outer"]
            assert sorted_["Actual Rows"] <= 51, (key, shape(plan))
        if node["Node Type"] in ("Index Scan", "Seq Scan", "Bitmap Heap Scan"):
            removed = node.get("Rows Removed by Filter", 0)
            assert read + removed <= entity_keys.ENTITY_KEY_WINDOW + 51, (key, shape(plan))


def test_a_key_history_pages_across_the_window_in_order(log, monkeypatch):
    monkeypatch.setattr(entity_keys, "ENTITY_KEY_WINDOW", 7)
    for namespace, key in [*ENTITY_KEY_CASES, (pop.MID_NS, "/n"), (pop.RARE_NS, "/tags")]:
        entity, before = EntityKey(namespace, "item", "obj-0"), None
        for _ in range(6):
            rows = entity_keys.entity_key_history(
                key=entity, pointer=key, before_seq=before, limit=5
            )
            assert [r.seq for r in rows] == brute_entity_key(namespace, key, before)[:5], key
            if len(rows) < 5:
                break
            before = rows[-1].seq
