"""As-of reads after a cut keep their plan: index order merged, never a walk of the state.

After a cut, an as-of page reads the hot revisions beside the state at the cut
(``boundary.revision_source``). The two arms must merge in index order (Merge
Append under the page's LIMIT), not each be read whole and sorted: with the
state's rows behind a WHERE of their own the planner did the latter, reading
every create of the namespace for a page of 50 (``bench/archive.py`` measured
it). EXPLAIN ANALYZE is the evidence, as in ``tests/changesets/test_scale_plans.py``.
"""

from __future__ import annotations

import pytest
from django.db import connection

from changesets.archive.models import ArchiveBase
from changesets.models import LogHead, Rpc
from changesets.ops import PutOp
from changesets.selectors import asof
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.changesets.archive.conftest import NS_A, cut
from tests.changesets.test_time_seek import analyze, assert_seek, nodes

pytestmark = pytest.mark.django_db
KEYS = 3000


@pytest.fixture
def archived(make_user, archive_dir, settings, publish_committed):
    settings.ATLAS_ARCHIVE_SEGMENT_REVISIONS = 10_000
    root = make_user("root", superuser=True)
    make_user("maker", maintainer=[NS_A])
    for start in range(0, KEYS, 500):
        ops = [
            PutOp(EntityKey(NS_A, "doc", f"k{n:05d}"), {"n": n}) for n in range(start, start + 500)
        ]
        changeset_apply(store=baseline, actor=root, ops=ops, rpc=Rpc.BATCH_MUTATE)
    for n in range(0, KEYS, 97):  # some keys move on after the cut
        op = PutOp(EntityKey(NS_A, "doc", f"k{n:05d}"), {"n": -n})
        changeset_apply(store=baseline, actor=root, ops=[op], rpc=Rpc.PUT_ENTITY)
    publish_committed()
    head = LogHead.objects.get().seq
    cut(KEYS // 500 + 1)  # the batches archived, the later puts hot
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE changesets_archivebase")
        cursor.execute("ANALYZE changesets_revision")
    assert ArchiveBase.objects.count() == KEYS
    return head


def _page_sql(point: int) -> str:
    sql = asof._statement("namespace = %s", point)
    return sql % (point, f"'{NS_A}'", 82, point)


def test_an_as_of_page_after_the_cut_merges_both_sides_in_index_order(archived):
    plan = analyze(_page_sql(archived))
    kinds = [n["Node Type"] for n in nodes(plan)]
    assert "Merge Append" in kinds, kinds
    assert_seek(plan, most=500)  # a page's worth of rows, never the namespace's 3,000
    page = asof.entities_as_of(seq=archived, namespaces=None, namespace=NS_A, limit=100)
    assert [e.key.slug for e in page] == [f"k{n:05d}" for n in range(100)]
    assert (page[97].content, page[97].version) == ({"n": -97}, 2)  # moved on after the cut
    assert (page[96].content, page[96].version) == ({"n": 96}, 1)  # held by the state


def test_one_entity_as_of_after_the_cut_is_a_seek(archived):
    sql = asof._statement("namespace = %s AND kind = %s AND slug = %s", archived)
    plan = analyze(sql % (archived, f"'{NS_A}'", "'doc'", "'k01234'", 1, archived))
    assert_seek(plan, most=10)
    found = asof.entity_as_of(seq=archived, key=EntityKey(NS_A, "doc", "k01234"))
    assert found is not None and found.content == {"n": 1234}
