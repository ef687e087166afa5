"""``GET /revisions?namespace=&key=`` costs what the cheaper way to its page costs.

A GIN index cannot return a key's revisions newest first, so after a walk of
the namespace's newest revisions (``by_namespace.walk_revisions``) a page's
updates come from ``key_ladder.below``, which alternates probes of the key's
posting list and walks of the log, each rung ``KEY_STEP`` times the last (its
creates and deletes are ``key_images``': tests/changesets/test_key_images.py).
Every revision seeded here is an update. The log seeded here is
the shape that used to walk the whole log (33.6 s at 10M revisions in
bench/keys_blame_diff.py): a key with more matches than one probe holds, all
of them old, under a long run of writes to another namespace. EXPLAIN ANALYZE
counts the rows the walks read; paging through every rung against a brute
force over the rule's definition checks that the arms neither skip nor repeat.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from changesets import pointers
from changesets.fields import POINTER_SEPARATOR
from changesets.models import Revision
from changesets.selectors import by_namespace, key_ladder, keys
from tests.changesets.partition_helpers import parent_index
from tests.changesets.test_time_seek import analyze, nodes

pytestmark = pytest.mark.django_db

OLD, BUSY = "ladder.old", "ladder.busy"
UUID_OF = (
    "(lpad(to_hex(1700000000000 + {g}), 12, '0') || '7000' || '8'"
    " || lpad(to_hex({g}), 15, '0'))::uuid"
)


# A revision's images and versions by its op, as the table's check wants them.
IMAGES = {
    "update": "NULL, jsonb_build_object('r', r), 1, 2",
    "create": "NULL, jsonb_build_object('r', r), NULL, 1",
    "delete": "jsonb_build_object('r', r), NULL, 1, NULL",
}


def write(
    cursor: Any,
    namespace: str,
    first: int,
    count: int,
    changed: str,
    per: int = 1,
    op: str = "update",
) -> int:
    """``count`` changesets of ``per`` revisions in ``namespace`` from seq ``first``,
    each an ``op`` of entity ``e<r>`` whose ``changed`` is the SQL expression
    ``changed`` (over ``r``, the revision's number in this run); the next free seq."""
    cursor.execute(
        f"""
        INSERT INTO changesets_changeset
            (id, seq, author_id, author_name, at, message, comment, branch, rpc, op_count,
             namespaces, prev_hash, hash)
        SELECT {UUID_OF.format(g="g")}, g, NULL, 'ladder', to_timestamp(1700000000 + g),
               'BatchMutate', '', '', 'BatchMutate', %(per)s, ARRAY[%(ns)s], NULL, NULL
        FROM generate_series(%(first)s, %(first)s + %(count)s - 1) AS g
        """,
        {"first": first, "count": count, "ns": namespace, "per": per},
    )
    cursor.execute(
        f"""
        INSERT INTO changesets_revision
            (changeset_id, seq, branch, at, namespace, kind, slug, op, undo, after,
             before_version, after_version, changed)
        SELECT {UUID_OF.format(g="g")}, g, '', to_timestamp(1700000000 + g), %(ns)s, 'item',
               'e' || r, %(op)s, {IMAGES[op]}, array_to_string({changed}, '~2')
        FROM generate_series(0, %(count)s * %(per)s - 1) AS r,
             LATERAL (SELECT %(first)s + r / %(per)s AS g) AS x
        """,
        {"first": first, "count": count, "ns": namespace, "per": per, "op": op},
    )
    return first + count


@pytest.fixture
def log() -> None:
    """1,000 old creates in OLD (``/payload`` and ``/v``), 20,000 writes to BUSY,
    300 updates of OLD's ``/v`` (every third also ``/w``), 5,000 more to BUSY."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT seq FROM changesets_loghead WHERE id = 1")
        seq = cursor.fetchone()[0] + 1
        seq = write(cursor, OLD, seq, 1000, "ARRAY['/payload', '/v']")
        seq = write(cursor, BUSY, seq, 10_000, "ARRAY['/v']", per=2)
        every_third = "CASE WHEN r %% 3 = 0 THEN ARRAY['/v', '/w'] ELSE ARRAY['/v'] END"
        seq = write(cursor, OLD, seq, 300, every_third)
        seq = write(cursor, BUSY, seq, 5000, "ARRAY['/v']")
        cursor.execute("UPDATE changesets_loghead SET seq = %s WHERE id = 1", [seq - 1])
        cursor.execute("ANALYZE changesets_revision")


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ladder at the seeded log's scale: walks of 100, 1,000, 10,000 revisions,
    probes of 200, 2,000, 20,000 matches; before it, a walk of the namespace's
    newest 20 changesets (at most 30 revisions)."""
    walk_of_the_namespace(monkeypatch, 20, 30)
    monkeypatch.setattr(key_ladder, "KEY_WINDOW", 100)
    monkeypatch.setattr(key_ladder, "KEY_PROBE", 200)
    monkeypatch.setattr(key_ladder, "KEY_STEP", 10)
    monkeypatch.setattr(key_ladder, "KEY_RUNGS", 3)


def walk_of_the_namespace(monkeypatch: pytest.MonkeyPatch, changesets: int, revisions: int) -> None:
    monkeypatch.setattr(by_namespace, "WALK_CHANGESETS", changesets)
    monkeypatch.setattr(by_namespace, "WALK_REVISIONS", revisions)


def brute(namespace: str, key: str, after: tuple[int, int] | None = None) -> list[int]:
    rows = Revision.objects.filter(branch="", namespace=namespace).values_list(
        "seq", "id", "changed"
    )
    hits = sorted(
        ((s, i) for s, i, changed in rows if any(pointers.relates(p, key) for p in changed)),
        reverse=True,
    )
    return [i for s, i in hits if after is None or (s, i) < after][:51]


def page(namespace: str, key: str, after: tuple[int, int] | None = None) -> Any:
    return keys.namespace_revisions(
        where=keys.RevisionFilter(namespace=namespace, key=key), after=after, limit=51
    )


def every_page(namespace: str, key: str, most: int | None = None) -> list[int]:
    """The ids of every page of ``key`` in ``namespace`` (pages of 51, each checked
    against :func:`brute` from its cursor), or of the pages up to ``most`` rows."""
    after, ids = None, []
    while True:
        rows = page(namespace, key, after)
        assert [r.id for r in rows] == brute(namespace, key, after), (key, after)
        ids += [r.id for r in rows]
        if len(rows) < 51 or (most is not None and len(ids) > most):
            return ids
        after = (rows[-1].seq, rows[-1].id)


def statements(call: Any, *, walk: list[str] | None = None) -> tuple[Any, list[str]]:
    """The result of ``call()`` and the ladder's statements it ran (a rung each): less
    the read of the log head, the walk of the namespace (first; appended to ``walk``
    if given), the page's creates and deletes (``key_images``, next to last: this
    log has none), and the last, which reads the page's changesets by their seqs
    (``rows.with_briefs``)."""
    with CaptureQueriesContext(connection) as queries:
        result = call()
    head, first, *rungs, images, briefs = [q["sql"] for q in queries.captured_queries]
    assert head.startswith('SELECT "changesets_loghead"."seq"'), head
    assert first.startswith("WITH cs AS MATERIALIZED"), first
    assert images.startswith("WITH win AS MATERIALIZED"), images
    assert briefs.startswith("SELECT seq, author_name, rpc, comment FROM changesets_changeset")
    if walk is not None:
        walk.append(first)
    return result, rungs


def walked(plan: dict[str, Any]) -> int:
    """Revisions the plan read off ``revision_seq_entity`` (walks and their bounds)."""
    return sum(
        n["Actual Rows"] * n.get("Actual Loops", 1) + n.get("Rows Removed by Filter", 0)
        for n in nodes(plan)
        if "Index Name" in n and parent_index(n["Index Name"]) == "revision_seq_entity"
    )


def test_an_old_key_with_more_matches_than_a_probe_is_not_walked_back_to(log, small):
    # /payload: 1,000 matches, all under 25,000 newer revisions. The first probe
    # (200) comes up full, the second (2,000) holds them all: the page is theirs.
    # Before the ladder the walk went on through all 25,000.
    rows, sqls = statements(lambda: page(OLD, "/payload"))
    assert [r.id for r in rows] == brute(OLD, "/payload")
    assert len(rows) == 51
    # Two rungs, a statement each: the first probe (below the namespace's walk),
    # then the second rung's walk and its bound's ten hops of 100 (and a row past
    # each hop's end), within a hop's worth.
    assert len(sqls) == 2, sqls
    read = sum(walked(analyze(sql)) for sql in sqls)
    assert read <= 1000 + 11 * 101, read


def test_a_key_quiet_under_a_short_burst_is_walked_to(log, small):
    # OLD's /v has 1,300 matches, the newest 5,000 revisions down. Walked from the
    # log's top, the window missed them, the first probe was full, the second
    # rung's walk was 1,000 short of them and the second probe held all 1,300. Now
    # the namespace's walk reads its newest 20 (all /v), the first probe (200) is
    # full, and the second rung's walk goes on from there, among OLD's revisions.
    walk: list[str] = []
    rows, sqls = statements(lambda: page(OLD, "/v"), walk=walk)
    assert [r.id for r in rows] == brute(OLD, "/v")
    assert len(sqls) == 2, sqls
    assert walked(analyze(walk[0])) <= 20
    assert walked(analyze(sqls[0])) == 0  # the probe alone
    # The walk, and its bound's ten hops of 100 (and a row past each), within a hop's worth.
    assert walked(analyze(sqls[1])) <= 1000 + 11 * 101


def test_a_key_changed_often_is_one_statement(log, small, monkeypatch):
    # BUSY's /v is in every one of its revisions: the namespace's walk fills the
    # page, and no rung of the ladder is planned or sent.
    walk_of_the_namespace(monkeypatch, 100, 100)
    walk: list[str] = []
    rows, sqls = statements(lambda: page(BUSY, "/v"), walk=walk)
    assert [r.id for r in rows] == brute(BUSY, "/v") and len(rows) == 51
    assert sqls == []
    assert walked(analyze(walk[0])) <= 51


def test_a_key_the_namespace_changes_often_is_found_under_other_namespaces_writes(log):
    # OLD's /v is in every one of its 300 newest revisions, under 5,000 writes to
    # BUSY. The ladder's walk of the log's newest revisions would read BUSY's 3,000
    # and then count OLD's 1,300 matches off the posting list; walked by OLD's own
    # changesets (the sizes as shipped), the page is OLD's newest 51 revisions.
    walk: list[str] = []
    rows, sqls = statements(lambda: page(OLD, "/v"), walk=walk)
    assert [r.id for r in rows] == brute(OLD, "/v") and len(rows) == 51
    assert sqls == []
    assert walked(analyze(walk[0])) <= 51


@pytest.mark.parametrize(
    "probe, step, rungs, walk",
    [
        (200, 10, 3, (20, 30)),
        (20, 2, 2, (7, 5)),
        (5, 3, 3, (1, 1)),
        (2000, 10, 1, (1000, 3000)),
        (1, 2, 1, (50, 2)),
    ],
    ids=["probe-holds", "last-walk", "three-rungs", "one-rung", "tiny"],
)
def test_every_page_across_every_rung_in_order(log, monkeypatch, probe, step, rungs, walk):
    # ``walk``: the namespace's walk's changesets and revisions. Fewer revisions than
    # changesets' (BUSY's are two each) stop it inside a changeset, whose rows are
    # then the ladder's.
    walk_of_the_namespace(monkeypatch, *walk)
    monkeypatch.setattr(key_ladder, "KEY_WINDOW", 100)
    monkeypatch.setattr(key_ladder, "KEY_PROBE", probe)
    monkeypatch.setattr(key_ladder, "KEY_STEP", step)
    monkeypatch.setattr(key_ladder, "KEY_RUNGS", rungs)
    for namespace, key in [(OLD, "/v"), (OLD, "/w"), (OLD, "/payload"), (BUSY, "/v")]:
        seen = every_page(namespace, key, most=600 if namespace == BUSY else None)
        if namespace == OLD:
            assert len(seen) == {"/v": 1300, "/w": 100, "/payload": 1000}[key]


def test_a_batch_wider_than_the_window_pages_without_repeats(small):
    # 3 changesets of 150 revisions each: a page can start inside a seq that holds
    # more revisions than the window, so the probe's range includes the page's own
    # seq and must keep the cursor's (seq, id) bound.
    with connection.cursor() as cursor:
        cursor.execute("SELECT seq FROM changesets_loghead WHERE id = 1")
        seq = write(cursor, OLD, cursor.fetchone()[0] + 1, 3, "ARRAY['/v']", per=150)
        seq = write(cursor, BUSY, seq, 500, "ARRAY['/v']")
        cursor.execute("UPDATE changesets_loghead SET seq = %s WHERE id = 1", [seq - 1])
    ids = every_page(OLD, "/v")
    assert len(ids) == len(set(ids)) == 450


SHAPES = ["/a", "/a/b", "/a/b/c", "/ab", "/a~1b", "/a~0", "/", "/a/", "/a//x", "//", "/b", "/é"]


def test_the_walks_key_test_is_the_index_rule_on_every_pointer_shape():
    """``keys.touching`` (what walks and blame test row by row) and
    ``atlas_key_terms && atlas_key_query`` (what the GIN index answers) decide alike for
    every key and every changed pointer, escaped pointers and empty members included,
    and for several keys at once (blame's open leaves) as their union; both agree with
    the rule as API.md words it."""
    changed_sets = [[p] for p in SHAPES] + [["/a/b/c", "/b"], ["/", "/ab"], []]
    with connection.cursor() as cursor:
        for keyset in [[k] for k in SHAPES] + [["/a/b", "/b"], ["/a/", "//", "/é"]]:
            sql, params = keys.touching(keyset)
            index_rule = " OR ".join(
                "atlas_key_terms('', 'ns', changesets_revision.changed, 'update')"
                " && atlas_key_query('', 'ns', %s)"
                for _ in keyset
            )
            for changed in changed_sets:
                cursor.execute(  # stored as the column holds them (migration 0035)
                    f"SELECT ({index_rule}) IS TRUE, ({sql}) IS TRUE"
                    " FROM (SELECT %s::text AS changed) AS changesets_revision",
                    [*keyset, *params, POINTER_SEPARATOR.join(changed)],
                )
                by_index, by_walk = cursor.fetchone()
                expected = any(pointers.relates(p, k) for p in changed for k in keyset)
                assert (by_index, by_walk) == (expected, expected), (keyset, changed)
