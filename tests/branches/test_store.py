"""The overlay store: read-through, tombstones, versions, and what a branch write records."""

from __future__ import annotations

import random

import pytest

from atlas.exceptions import PermissionDenied, PreconditionFailed
from branches.exceptions import BranchClosed
from branches.models import Branch
from branches.services import branch_abandon, branch_member_add, branch_merge
from branches.store import BranchStore
from changesets.models import Changeset, JournalEntry, Revision
from changesets.ops import DeleteOp, PutOp
from entities.store import EntityKey, baseline
from tests.branches.conftest import NS, key, overlay
from tests.changesets.helpers import (
    assert_json_identical,
    assert_revision,
    entity_table,
    only_revision,
    replayed_table,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(writer, write, make_branch):
    """Baseline a=1, b=1, c=1 (all v1), and a fresh branch ``feature``."""
    for slug in "abc":
        write(writer, f"{NS}/order/{slug}", {"n": 1})
    return make_branch(writer)


def test_branch_reads_see_baseline_until_the_branch_writes(writer, write, bwrite, seeded):
    store = BranchStore(seeded)
    assert store.get(key(f"{NS}/order/a")).content == {"n": 1}

    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    write(writer, f"{NS}/order/b", {"n": 3})  # baseline moves on: the branch sees it

    assert store.get(key(f"{NS}/order/a")).content == {"n": 2}
    assert store.get(key(f"{NS}/order/b")).content == {"n": 3}
    assert baseline.get(key(f"{NS}/order/a")).content == {"n": 1}
    listed = store.list(namespaces=None)
    assert [(e.key.slug, e.content) for e in listed] == [
        ("a", {"n": 2}),
        ("b", {"n": 3}),
        ("c", {"n": 1}),
    ]


def test_tombstone_hides_baseline_entity_on_the_branch_only(writer, bwrite, seeded):
    bwrite(writer, seeded, f"{NS}/order/b", None)

    store = BranchStore(seeded)
    assert store.get(key(f"{NS}/order/b")) is None
    assert [e.key.slug for e in store.list(namespaces=None)] == ["a", "c"]
    assert baseline.get(key(f"{NS}/order/b")) is not None
    row = overlay(seeded)[key(f"{NS}/order/b")]
    assert row.deleted and row.content is None and row.version is None
    assert row.base_version == 1


def test_branch_writes_are_invisible_on_baseline(writer, bwrite, seeded):
    before = entity_table()
    bwrite(
        writer,
        seeded,
        ops=[
            PutOp(key(f"{NS}/order/new"), {"n": 9}),
            PutOp(key(f"{NS}/order/a"), {"n": 2}),
            DeleteOp(key(f"{NS}/order/c")),
        ],
    )
    assert entity_table() == before
    assert replayed_table() == before  # baseline history untouched
    assert baseline.get(key(f"{NS}/order/new")) is None
    assert BranchStore(seeded).get(key(f"{NS}/order/new")).content == {"n": 9}


def test_branch_changeset_has_branch_set_and_no_journal_entry(writer, bwrite, seeded):
    result = bwrite(writer, seeded, f"{NS}/order/a", {"n": 2}, comment="try it")

    changeset = Changeset.objects.get(pk=result.changeset.pk)
    assert changeset.branch == "feature"
    assert changeset.author_name == writer.username
    assert changeset.comment == "try it"
    assert not JournalEntry.objects.filter(changeset=changeset).exists()
    revision = only_revision(changeset)
    assert revision.branch == "feature"
    assert_revision(
        revision, op="update", before={"n": 1}, after={"n": 2}, before_version=1, after_version=2
    )


def test_branch_history_chains_from_baseline_state(writer, bwrite, seeded):
    """Each branch revision is true on its own: before = what the branch saw."""
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 3})
    bwrite(writer, seeded, f"{NS}/order/a", None)
    revs = list(Revision.objects.filter(branch="feature").order_by("seq"))
    assert [(r.op, r.before_version, r.after_version) for r in revs] == [
        ("update", 1, 2),
        ("update", 2, 3),
        ("delete", 3, None),
    ]
    assert_json_identical(revs[0].before, {"n": 1})


def test_versions_on_a_branch_continue_baselines_and_never_restart(writer, write, bwrite, seeded):
    write(writer, f"{NS}/order/a", {"n": 2})  # baseline a is v2
    assert bwrite(writer, seeded, f"{NS}/order/a", {"n": 3}).results[0].version == 3
    bwrite(writer, seeded, f"{NS}/order/a", None)
    recreated = bwrite(writer, seeded, f"{NS}/order/a", {"n": 4})
    assert recreated.results[0].status == "created"
    assert recreated.results[0].version == 4  # after the branch's v3, never reusing it

    # A key absent on the branch continues after baseline's history too.
    write(writer, f"{NS}/order/gone", {"n": 1})
    write(writer, f"{NS}/order/gone", {"n": 2})
    write(writer, f"{NS}/order/gone", None)
    assert bwrite(writer, seeded, f"{NS}/order/gone", {"n": 1}).results[0].version == 3


def test_base_version_is_recorded_on_the_first_write_only(writer, write, bwrite, seeded):
    write(writer, f"{NS}/order/a", {"n": 2})  # v2 when the branch first writes it
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 10})
    write(writer, f"{NS}/order/a", {"n": 3})  # baseline moves to v3
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 11})
    bwrite(writer, seeded, f"{NS}/order/fresh", {"n": 1})

    rows = overlay(seeded)
    assert rows[key(f"{NS}/order/a")].base_version == 2
    assert rows[key(f"{NS}/order/a")].version == 4  # 3 on the branch, then 4
    assert rows[key(f"{NS}/order/fresh")].base_version is None


def test_if_match_on_a_branch_uses_the_branch_view(writer, write, bwrite, seeded):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})  # branch v2
    with pytest.raises(PreconditionFailed):
        bwrite(writer, seeded, ops=[PutOp(key(f"{NS}/order/a"), {"n": 3}, if_match=1)])
    ok = bwrite(writer, seeded, ops=[PutOp(key(f"{NS}/order/a"), {"n": 3}, if_match=2)])
    assert ok.results[0].version == 3
    # A key the branch never wrote is judged against baseline's version.
    write(writer, f"{NS}/order/b", {"n": 2})
    ok = bwrite(writer, seeded, ops=[PutOp(key(f"{NS}/order/b"), {"n": 5}, if_match=2)])
    assert ok.results[0].version == 3


def test_a_branch_update_keeps_baseline_created_at(writer, bwrite, seeded):
    base = baseline.get(key(f"{NS}/order/a"))
    result = bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    on_branch = BranchStore(seeded).get(key(f"{NS}/order/a"))
    assert on_branch.created_at == base.created_at
    assert on_branch.updated_at > base.updated_at
    assert on_branch.changeset_id == result.changeset.id


def test_recreating_over_a_tombstone_is_a_create(writer, bwrite, seeded):
    bwrite(writer, seeded, f"{NS}/order/a", None)
    result = bwrite(writer, seeded, f"{NS}/order/a", {"n": 7})
    assert result.results[0].status == "created"
    assert only_revision(result.changeset).op == "create"
    row = overlay(seeded)[key(f"{NS}/order/a")]
    assert not row.deleted and row.base_version == 1  # still what the branch started from


def test_created_then_deleted_in_one_batch_leaves_no_overlay_row(writer, bwrite, seeded):
    result = bwrite(
        writer,
        seeded,
        ops=[PutOp(key(f"{NS}/order/tmp"), {"n": 1}), DeleteOp(key(f"{NS}/order/tmp"))],
    )
    assert result.changeset is None
    assert overlay(seeded) == {}


def test_a_branch_records_the_namespaces_it_touched(make_user, bwrite, make_branch):
    user = make_user("wendy", writer=["acme.orders", "acme.billing"])
    branch = make_branch(user)
    assert branch.namespaces == []
    bwrite(user, branch, "acme.orders/order/a", {"n": 1})
    bwrite(user, branch, "acme.billing/invoice/i", {"n": 1})
    bwrite(user, branch, "acme.orders/order/b", {"n": 1})
    branch.refresh_from_db()
    assert branch.namespaces == ["acme.billing", "acme.orders"]


def test_dry_run_on_a_branch_writes_nothing(writer, bwrite, seeded):
    result = bwrite(writer, seeded, f"{NS}/order/a", {"n": 2}, dry_run=True)
    assert result.changeset is None and result.results[0].status == "updated"
    assert overlay(seeded) == {}
    assert not Changeset.objects.filter(branch="feature").exists()


@pytest.mark.parametrize("close", ["merge", "abandon"])
def test_closed_branches_refuse_writes(writer, bwrite, seeded, close):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    if close == "merge":
        branch_merge(branch=seeded, actor=writer)
    else:
        branch_abandon(branch=seeded, actor=writer)
    with pytest.raises(BranchClosed) as info:
        bwrite(writer, seeded, f"{NS}/order/b", {"n": 2})
    assert info.value.status == 409
    # Even a batch that would change nothing is refused: the branch takes no writes.
    with pytest.raises(BranchClosed):
        bwrite(writer, seeded, ops=[])


def test_reads_are_one_statement_each(writer, bwrite, seeded, django_assert_num_queries):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    store = BranchStore(seeded)
    with django_assert_num_queries(1):
        store.get(key(f"{NS}/order/a"))
    with django_assert_num_queries(1):
        store.list(namespaces=[NS], kind="order", slug_prefix="a", limit=10)


def test_list_pages_match_the_merged_view(writer, write, bwrite, make_branch, make_user):
    """Random overlays over a random baseline: every page size walks the exact view."""
    other = "acme.billing"
    user = make_user("wendy", writer=[NS, other])
    rng = random.Random(4)
    slugs = [f"s{i:03d}" for i in range(60)]
    batch = []
    for slug in slugs:
        if rng.random() < 0.6:
            ns = rng.choice([NS, other])
            batch.append(PutOp(EntityKey(ns, rng.choice(["order", "item"]), slug), {"v": slug}))
    from changesets.services.apply import changeset_apply

    changeset_apply(store=baseline, actor=user, ops=batch, rpc="BatchMutate")
    branch = make_branch(user)
    expected = {e.key: e.content for e in baseline.list(namespaces=None, limit=1000)}
    ops = []
    for k in list(expected):
        roll = rng.random()
        if roll < 0.25:
            ops.append(DeleteOp(k))
            del expected[k]
        elif roll < 0.5:
            ops.append(PutOp(k, {"branch": k.slug}))
            expected[k] = {"branch": k.slug}
    for i in range(15):
        k = EntityKey(rng.choice([NS, other]), "order", f"b{i:02d}")
        ops.append(PutOp(k, {"new": i}))
        expected[k] = {"new": i}
    bwrite(user, branch, ops=ops)

    store = BranchStore(branch)
    for page in (1, 3, 7, 50, 500):
        seen, after = [], None
        while True:
            rows = store.list(namespaces=None, after=after, limit=page)
            seen.extend(rows)
            if len(rows) < page:
                break
            after = rows[-1].key
        assert [e.key for e in seen] == sorted(expected)
        assert {e.key: e.content for e in seen} == expected
    # Filters apply to both halves.
    only = store.list(namespaces=[other], kind="order", slug_prefix="b", limit=500)
    assert [e.key for e in only] == sorted(
        k for k in expected if k.namespace == other and k.kind == "order" and k.slug[0] == "b"
    )


def test_a_stale_branch_object_still_sees_the_branch_closed(writer, bwrite, seeded):
    stale = Branch.objects.get(pk=seeded.pk)
    branch_abandon(branch=seeded, actor=writer)
    with pytest.raises(BranchClosed):
        bwrite(writer, stale, f"{NS}/order/a", {"n": 2})


def test_a_store_writing_for_someone_who_may_not_write_the_branch_refuses_and_writes_nothing(
    writer, make_user, bwrite, seeded
):
    """The writer rule sits in ``BranchStore.lock``, under the branch row lock: every
    path through the write service obeys it, dry runs included."""
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    walt = make_user("walt", writer=[NS])
    before = Changeset.objects.count()
    for dry_run in (False, True):
        with pytest.raises(PermissionDenied, match="feature"):
            bwrite(walt, seeded, f"{NS}/order/b", {"n": 2}, dry_run=dry_run)
    assert Changeset.objects.count() == before
    assert key(f"{NS}/order/b") not in overlay(seeded)

    assert branch_member_add(branch=seeded, user=walt, actor=writer) is True
    assert branch_member_add(branch=seeded, user=walt, actor=writer) is False
    assert bwrite(walt, seeded, f"{NS}/order/b", {"n": 2}).changeset.author_name == "walt"
