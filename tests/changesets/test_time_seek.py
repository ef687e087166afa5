"""Time-bounded reads are seeks (issues 17 and 18): ``as_of_time`` and ``since``/``until``.

A table of 120,000 changesets seeded in SQL (time rising with seq, one
namespace busy, one rare, some on a branch): resolving a time two years deep
must read a handful of rows, for a superuser and for a caller who reads only
the rare namespace, and so must ``/changesets?until=<old>``. EXPLAIN ANALYZE
is the evidence: no sequential scan, and few rows read or removed by a filter.
The boundary itself is a bisection of seq (``atlas_seq_bound``, migration
0032), which EXPLAIN does not see into: its buffer count is the evidence there.
A later migration that loses it or the ascending seq indexes fails here.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from changesets.models import BASELINE, Changeset, Rpc
from changesets.ops import PutOp
from changesets.selectors import asof
from changesets.selectors.bounds import end_of_millisecond
from changesets.selectors.log import changeset_list
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.atlas.test_errors import assert_problem
from tests.entities.factories import NamespaceFactory

pytestmark = pytest.mark.django_db

BUSY, RARE, OTHER = "acme.orders", "acme.rare", "acme.billing"
ROWS = 120_000
START = datetime(2023, 1, 1, tzinfo=UTC)
API = "/api/v1"


def seed(cursor: Any) -> int:
    """``ROWS`` changesets one second apart; every 5,000th in RARE, every 50th on a branch."""
    cursor.execute("SELECT COALESCE(max(seq), 0) FROM changesets_changeset")
    first = cursor.fetchone()[0] + 1
    cursor.execute(
        "INSERT INTO changesets_changeset (id, seq, author_name, at, message, comment, branch,"
        " rpc, op_count, namespaces, prev_hash, hash)"
        " SELECT gen_random_uuid(), s, 'seed', %(start)s + (s - %(first)s) * interval '1 second',"
        " '', '', CASE WHEN s %% 50 = 0 THEN 'feature' ELSE '' END, 'PutEntity', 1,"
        " ARRAY[CASE WHEN s %% 5000 = 1 THEN %(rare)s ELSE %(busy)s END]::varchar[], NULL, NULL"
        " FROM generate_series(%(first)s, %(last)s) AS s",
        {"start": START, "first": first, "last": first + ROWS - 1, "rare": RARE, "busy": BUSY},
    )
    # The log head, as the write service leaves it (a merged list page starts there).
    cursor.execute(
        "INSERT INTO changesets_loghead (id, seq, at) VALUES (1, %s, %s)"
        " ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, at = EXCLUDED.at",
        [first + ROWS - 1, START + timedelta(seconds=ROWS - 1)],
    )
    cursor.execute("ANALYZE changesets_changeset")
    return first


@pytest.fixture
def seeded() -> int:
    with connection.cursor() as cursor:
        return seed(cursor)


def analyze(sql: str) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        raw = cursor.fetchone()[0]
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def assert_seek(plan: dict[str, Any], *, most: int = 1_000) -> None:
    """No sequential scan; every scan reads and discards at most ``most`` rows.

    (A Seq Scan that read nothing is an empty revision partition, ahead of the log
    head: the cheapest plan there, and it costs nothing.)
    """
    found = list(nodes(plan))
    walks = [
        n
        for n in found
        if n["Node Type"] == "Seq Scan"
        and (n.get("Actual Rows", 0) or n.get("Rows Removed by Filter", 0))
    ]
    assert not walks, found
    for node in found:
        if "Scan" in node["Node Type"]:
            read = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
            removed = node.get("Rows Removed by Filter", 0) + node.get(
                "Rows Removed by Index Recheck", 0
            )
            assert read <= most and removed <= most, node


def only_sql(call: Any) -> tuple[Any, str]:
    """The result of ``call()`` and the one statement it ran, besides a read of the
    log head (where a merged list page starts: ``bounds.newest_in_window``) and the
    resolution of its time bounds to seqs (``bounds.resolve``)."""
    with CaptureQueriesContext(connection) as queries:
        result = call()
    sqls = [
        q["sql"]
        for q in queries.captured_queries
        if '"changesets_loghead"' not in q["sql"] and not q["sql"].startswith(RESOLVE)
    ]
    assert len(sqls) == 1, queries.captured_queries
    return result, sqls[0]


RESOLVE = "SELECT atlas_seq_bound("
BRIEFS = "SELECT seq, author_name, rpc, comment FROM changesets_changeset WHERE seq = ANY("


def page_sql(call: Any) -> tuple[Any, str, str | None]:
    """The result of ``call()``, the one page statement it ran and the one that
    read the page's changesets by their seqs (``rows.with_briefs``; None for an
    empty page)."""
    with CaptureQueriesContext(connection) as queries:
        result = call()
    sqls = [q["sql"] for q in queries.captured_queries]
    briefs = [sql for sql in sqls if sql.startswith(BRIEFS)]
    pages = [sql for sql in sqls if not sql.startswith(BRIEFS)]
    assert len(pages) == 1 and len(briefs) <= 1, sqls
    assert bool(briefs) == bool(result), sqls
    return result, pages[0], briefs[0] if briefs else None


def brute(at: datetime, namespaces: list[str] | None) -> Changeset | None:
    """``as_of_time`` by its definition: the newest visible baseline changeset at or before."""
    qs = Changeset.objects.filter(branch=BASELINE, at__lte=end_of_millisecond(at))
    if namespaces is not None:
        qs = qs.filter(namespaces__overlap=namespaces)
    return qs.order_by("-seq").first()


DEPTHS = [0.0, 0.5, 0.9, 0.999]  # how far back from the newest, as a share of the log
READERS = [None, [BUSY], [RARE], [RARE, OTHER], [OTHER]]


def arms_sql(call: Any) -> tuple[Any, str]:
    """The result of ``call()`` and its one statement that reads changesets.

    A scoped reader's ``as_of_time`` reads the time's seq boundary first, then
    its arms a partition at a time from the boundary's down (migration 0038):
    here the first partition holds the answer, so one such statement.
    """
    with CaptureQueriesContext(connection) as queries:
        result = call()
    reads = [
        q["sql"]
        for q in queries.captured_queries
        if "FROM changesets_changeset" in q["sql"].replace('"', "")
    ]
    assert len(reads) == 1, queries.captured_queries
    assert len(queries.captured_queries) <= 3, queries.captured_queries  # boundary, catalog
    return result, reads[0]


@pytest.mark.parametrize("depth", DEPTHS)
def test_as_of_time_is_a_seek_at_any_depth_for_any_reader(seeded, depth):
    at = START + timedelta(seconds=int(ROWS * (1 - depth)), milliseconds=400)
    for namespaces in READERS:
        found, sql = arms_sql(lambda ns=namespaces: asof.as_of_time(at=at, namespaces=ns))
        expected = brute(at, namespaces)
        assert (found and found.seq) == (expected and expected.seq), namespaces
        assert_seek(analyze(sql))


def test_as_of_time_ties_within_a_millisecond_go_to_the_highest_seq(seeded):
    at = START + timedelta(seconds=10)
    with connection.cursor() as cursor:  # three more in the same millisecond, one invisible
        seed_tie = (
            "INSERT INTO changesets_changeset (id, seq, author_name, at, message, comment,"
            " branch, rpc, op_count, namespaces, prev_hash, hash) SELECT gen_random_uuid(),"
            " %s, 'tie', %s, '', '', '', 'PutEntity', 1, ARRAY[%s]::varchar[], NULL, NULL"
        )
        cursor.execute("SELECT max(seq) FROM changesets_changeset")
        top = cursor.fetchone()[0]
        late = datetime(2030, 1, 1, tzinfo=UTC)
        for offset, ns in ((1, RARE), (2, BUSY), (3, OTHER)):
            cursor.execute(seed_tie, [top + offset, late + timedelta(microseconds=offset), ns])
    for namespaces in READERS:
        found = asof.as_of_time(at=late, namespaces=namespaces)
        expected = brute(late, namespaces)
        assert found is not None and expected is not None
        assert found.seq == expected.seq, namespaces
    assert asof.as_of_time(at=late, namespaces=[BUSY]).seq == top + 2
    assert asof.as_of_time(at=at - timedelta(days=1), namespaces=None) is None


def test_until_and_since_pages_are_seeks(seeded):
    old = START + timedelta(seconds=ROWS // 10)
    cases = [
        {"until": old},
        {"until": old, "branch": BASELINE},
        {"until": old, "author": "seed"},
        {"since": old, "until": old + timedelta(hours=1)},
        {"since": START + timedelta(seconds=ROWS - 100)},
    ]
    for filters in cases:
        for namespaces in (None, [BUSY]):
            rows, sql = only_sql(
                lambda f=filters, ns=namespaces: changeset_list(namespaces=ns, limit=51, **f)
            )
            assert rows, filters
            bound = filters.get("until")
            assert bound is None or all(r.at <= bound for r in rows)
            assert [r.seq for r in rows] == sorted((r.seq for r in rows), reverse=True)
            assert_seek(analyze(sql))
    # The first row of ``until`` is the last changeset at or before it.
    [newest] = changeset_list(namespaces=None, until=old, limit=1)
    assert newest.seq == Changeset.objects.filter(at__lte=old).order_by("-seq")[0].seq


def _bound(at: datetime, *, upper: bool) -> int | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT atlas_seq_bound(%s::timestamptz, %s)", [at, upper])
        return cursor.fetchone()[0]


@pytest.mark.parametrize("trial", range(3))
def test_the_time_boundary_is_the_brute_forced_one_across_gaps_and_ties(db, trial):
    """Against the definition (the highest seq at or before T; the lowest at or
    after), on a log with gaps in seq (an archive cut's removal, lost seqs) and
    many changesets in one instant, at times before, between, on and after."""
    rng = random.Random(trial)
    assert _bound(START, upper=True) is None and _bound(START, upper=False) is None
    rows, seq, at = [], 0, START
    for _ in range(rng.choice([1, 2, 7, 300])):
        seq += rng.choice([1, 1, 1, 2, 50])
        at += timedelta(milliseconds=rng.choice([0, 0, 1, 5, 1000]))
        rows.append((seq, at))
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO changesets_changeset (id, seq, author_name, at, message, comment,"
            " branch, rpc, op_count, namespaces) VALUES (gen_random_uuid(), %s, 'seed', %s,"
            " '', '', '', 'PutEntity', 1, ARRAY['x']::varchar[])",
            rows,
        )
    times = {t for _, t in rows} | {START - timedelta(days=1), at + timedelta(days=1)}
    times |= {t + timedelta(microseconds=d) for _, t in rows for d in (-1, 1)}
    for t in sorted(times):
        at_or_before = [s for s, a in rows if a <= t]
        at_or_after = [s for s, a in rows if a >= t]
        assert _bound(t, upper=True) == (max(at_or_before) if at_or_before else None), t
        assert _bound(t, upper=False) == (min(at_or_after) if at_or_after else None), t


@pytest.mark.parametrize("depth", DEPTHS)
def test_the_time_boundary_reads_a_logarithm_of_the_log(seeded, depth):
    """A bisection: about log2(120,000) = 17 probes of the seq index and their rows,
    a few blocks each, at any depth; a walk of the log would read thousands.
    (The function's statements count in the calling node's buffers.)"""
    at = START + timedelta(seconds=int(ROWS * (1 - depth)), milliseconds=400)
    for upper in (True, False):
        _bound(at, upper=upper)  # the function's first call in a session reads the catalog
        with connection.cursor() as cursor:
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT atlas_seq_bound(%s, %s)",
                [at, upper],
            )
            raw = cursor.fetchone()[0]
        plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
        blocks = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        assert 0 < blocks <= 120, (depth, upper, blocks)  # about 60 here


# --- resolve once per traversal ----------------------------------------------------------------


@pytest.fixture
def thirty(staff, db) -> list[Changeset]:
    NamespaceFactory(name=BUSY)
    NamespaceFactory(name=OTHER)
    keys = [EntityKey(BUSY, "order", f"e{i:03d}") for i in range(30)]
    made = []
    for ns in (BUSY, OTHER):
        ops = [PutOp(EntityKey(ns, k.kind, k.slug), {"n": 1}) for k in keys]
        result = changeset_apply(store=baseline, actor=staff, ops=ops, rpc=Rpc.BATCH_MUTATE)
        made.append(result.changeset)
    return made


def stamp(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@pytest.mark.parametrize("reader", ["root", "rita"])
def test_later_pages_of_an_as_of_time_listing_resolve_nothing(
    thirty, staff, make_user, client_for, reader
):
    user = staff if reader == "root" else make_user("rita", reader=[BUSY])
    client = client_for(user)
    point = thirty[-1]
    params = {"as_of_time": stamp(point.at), "page_size": 10}
    first = client.get(f"{API}/entities", params).json()
    expected_block = {"changeset_id": str(point.id), "seq": point.seq, "at": stamp(point.at)}
    if reader == "rita":  # rita cannot see the last changeset: hers is the one before
        mine = thirty[0]
        expected_block = {"changeset_id": str(mine.id), "seq": mine.seq, "at": stamp(mine.at)}
    assert first["as_of"] == expected_block
    seen = [r["slug"] for r in first["results"]]
    token = first["next_page_token"]
    while token:
        with CaptureQueriesContext(connection) as queries:
            page = client.get(f"{API}/entities", {**params, "page_token": token})
        assert page.status_code == 200
        touched = [q["sql"] for q in queries.captured_queries if "changesets_changeset" in q["sql"]]
        assert touched == [], "a later page resolved the point again"
        body = page.json()
        assert body["as_of"] == expected_block
        seen += [r["slug"] for r in body["results"]]
        token = body["next_page_token"]
    by_id = {"as_of": expected_block["changeset_id"], "page_size": 60}
    whole = client.get(f"{API}/entities", by_id).json()["results"]
    assert seen == [r["slug"] for r in whole]


def test_a_carried_point_is_bound_to_its_time_and_branch(thirty, staff, client_for):
    client = client_for(staff)
    params = {"as_of_time": stamp(thirty[-1].at), "page_size": 10}
    token = client.get(f"{API}/entities", params).json()["next_page_token"]
    earlier = {**params, "as_of_time": stamp(thirty[0].at)}
    assert_problem(client.get(f"{API}/entities", {**earlier, "page_token": token}), 400)
    assert_problem(client.get(f"{API}/entities", {"page_token": token, "page_size": 10}), 400)
    by_id = {"as_of": str(thirty[-1].id), "page_size": 10, "page_token": token}
    assert_problem(client.get(f"{API}/entities", by_id), 400)
    # The same moment in another offset names the same point: the token resumes.
    shifted = thirty[-1].at.astimezone(timezone(timedelta(hours=2)))
    same = {**params, "as_of_time": shifted.isoformat(timespec="milliseconds")}
    assert client.get(f"{API}/entities", {**same, "page_token": token}).status_code == 200
    branch = client.get(
        f"{API}/entities", {**params, "page_token": token}, HTTP_X_ATLAS_BRANCH="nope"
    )
    assert branch.status_code in (400, 404)
