"""A namespace's changesets, found by the ``namespaces`` array's position indexes (migration 0037).

``changesets.selectors.by_namespace`` answers "touched any of these namespaces"
from three indexes (position 1, position 2, and a GIN index of the arrays with
three or more) instead of one GIN index over every changeset. The arms must
add up to exactly the array overlap, whatever the array holds: one namespace,
two, many, in any order, on baseline or a branch. Each result here is checked
against the overlap itself, ``namespaces && {…}``, page by page.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from itertools import combinations
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from changesets.models import Changeset
from changesets.selectors import asof, by_namespace
from changesets.selectors.log import changeset_list
from tests.changesets.test_time_seek import analyze, nodes

pytestmark = pytest.mark.django_db

START = datetime(2024, 1, 1, tzinfo=UTC)
NAMES = ["a", "b", "c", "d", "e"]
# Every shape an array can take, in the order the log repeats them: the wide ones
# (three and more, some not in name order, one with a repeat) are the third index's.
SHAPES: list[list[str]] = [
    ["a"],
    ["b"],
    ["a"],
    ["a", "b"],
    ["c", "a"],
    ["e"],
    ["a", "b", "c"],
    ["d", "c", "b", "a"],
    ["b", "e", "b"],
    ["c"],
    ["a"],
    ["d", "e"],
]
ROWS = 600


@pytest.fixture
def log() -> None:
    """``ROWS`` changesets a second apart, cycling through ``SHAPES``; every 7th on a branch."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO changesets_changeset (id, seq, author_name, at, comment, branch,"
            " rpc, op_count, namespaces)"
            " SELECT gen_random_uuid(), s, CASE WHEN s %% 5 = 0 THEN 'rare' ELSE 'busy' END,"
            " %(start)s + s * interval '1 second', '', CASE WHEN s %% 7 = 0 THEN 'feature'"
            " ELSE '' END, 'PutEntity', 1, (%(shapes)s::jsonb ->> ((s - 1) %% %(n)s))::varchar[]"
            " FROM generate_series(1, %(rows)s) AS s",
            {
                "start": START,
                "shapes": _json_arrays(SHAPES),
                "n": len(SHAPES),
                "rows": ROWS,
            },
        )
        # The log head, as the write service leaves it: a list page starts there.
        cursor.execute(
            "INSERT INTO changesets_loghead (id, seq, at) VALUES (1, %s, %s)"
            " ON CONFLICT (id) DO UPDATE SET seq = EXCLUDED.seq, at = EXCLUDED.at",
            [ROWS, START + timedelta(seconds=ROWS)],
        )
        cursor.execute("ANALYZE changesets_changeset")


def _json_arrays(shapes: list[list[str]]) -> str:
    """The shapes as JSON whose element text is PostgreSQL's array literal for each."""
    return json.dumps(["{" + ",".join(shape) + "}" for shape in shapes])


def overlap(names: list[str], **filters: Any) -> list[int]:
    """The definition: every changeset whose array shares a name with ``names``."""
    qs = Changeset.objects.filter(namespaces__overlap=names, **filters)
    return list(qs.order_by("-seq").values_list("seq", flat=True))


def pages(**kwargs: Any) -> list[int]:
    """Every page of ``changeset_list`` in turn, 13 a page, as seqs."""
    seqs: list[int] = []
    before = None
    while True:
        page = changeset_list(limit=13, before_seq=before, **kwargs)
        seqs += [c.seq for c in page]
        if len(page) < 13:
            return seqs
        before = page[-1].seq


def test_the_log_holds_every_shape(log):
    stored = {tuple(ns) for ns in Changeset.objects.values_list("namespaces", flat=True)}
    assert stored == {tuple(shape) for shape in SHAPES}


def test_touching_is_the_array_overlap(log):
    for size in (1, 2, 3):
        for names in combinations(NAMES, size):
            found = Changeset.objects.filter(by_namespace.touching(list(names)))
            assert sorted(found.values_list("seq", flat=True), reverse=True) == overlap(
                list(names)
            ), names


@pytest.mark.parametrize("name", NAMES)
def test_a_namespace_filter_pages_through_exactly_its_changesets(log, name):
    for readers in (None, [name], NAMES):
        assert pages(namespaces=readers, namespace=name) == overlap([name]), readers
    for filters in ({"branch": ""}, {"author": "rare"}):
        found = pages(namespaces=None, namespace=name, **filters)
        where = {"branch": ""} if "branch" in filters else {"author_name": "rare"}
        assert found == overlap([name], **where), filters


@pytest.mark.parametrize("width", [1_000_000, 50, 7])
def test_a_scoped_readers_list_is_every_changeset_she_can_see_once(log, settings, width):
    # A merged page is read first within a partition's width below its start, then
    # below that (``bounds.newest_in_window``): narrow widths cross that line on most pages.
    settings.ATLAS_LOG_PARTITION_SEQS = width
    for size in (1, 2, 3):
        for names in combinations(NAMES, size):
            assert pages(namespaces=list(names)) == overlap(list(names)), names
            rare = pages(namespaces=list(names), author="rare")
            assert rare == overlap(list(names), author_name="rare"), names


def test_a_scoped_page_is_a_union_of_arms_each_cut_at_the_page(log):
    with CaptureQueriesContext(connection) as queries:
        page = changeset_list(namespaces=["d", "e"], limit=13)
    assert [c.seq for c in page] == overlap(["d", "e"])[:13]
    plan = analyze(queries.captured_queries[-1]["sql"])
    found = list(nodes(plan))
    # The outermost Append joins the arms (each arm may be an Append of its
    # partitions' scans, the changeset table being partitioned: migration 0038).
    append = next(n for n in found if n["Node Type"] == "Append")
    # Two positions for each of her two namespaces, and the wide batches.
    assert len(append["Plans"]) == 5
    for arm in append["Plans"]:
        assert arm["Actual Rows"] <= 13, arm


def test_as_of_time_for_a_scoped_reader_is_the_newest_visible_baseline_changeset(log):
    for offset in (0, 1, 2, 7, 50, 333, ROWS - 1, ROWS + 5):
        at = START + timedelta(seconds=offset, milliseconds=500)
        for size in (1, 2):
            for names in combinations(NAMES, size):
                found = asof.as_of_time(at=at, namespaces=list(names))
                expected = (
                    Changeset.objects.filter(branch="", at__lte=at, namespaces__overlap=list(names))
                    .order_by("-seq")
                    .first()
                )
                assert (found and found.seq) == (expected and expected.seq), (offset, names)


def test_a_wide_batch_is_found_through_the_third_index(log):
    """``e`` is never first or second in a wide array except ``["b", "e", "b"]``; ``d``
    only in ``["d", "c", "b", "a"]`` and ``["d", "e"]``: the wide arm must find
    ``c`` at position 2 of 4 and ``a`` at 3 and 4."""
    for name in ("a", "c"):
        found = pages(namespaces=None, namespace=name)
        wide = [
            c.seq
            for c in Changeset.objects.filter(namespaces__overlap=[name])
            if len(c.namespaces) >= 3 and name not in c.namespaces[:2]
        ]
        assert wide and set(wide) <= set(found), name
