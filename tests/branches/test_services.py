"""Branch services: create, merge (clean, conflicting, equal content, large), abandon."""

from __future__ import annotations

import pytest

from atlas.exceptions import NotFound, PayloadTooLarge, PermissionDenied, ValidationFailed
from branches.exceptions import BranchClosed, BranchExists, MergeConflict
from branches.models import Branch, BranchEntity, BranchStatus
from branches.selectors import branch_diff
from branches.services import branch_abandon, branch_create, branch_merge
from branches.store import BranchStore
from changesets.models import Changeset, JournalEntry, Revision, Rpc
from changesets.ops import DeleteOp, PutOp
from entities.store import baseline
from tests.branches.conftest import NS, key, overlay
from tests.changesets.helpers import (
    assert_nothing_written,
    assert_revision,
    entity_table,
    log_snapshot,
    replayed_table,
    revisions_by_key,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def merger(make_user):
    return make_user("mallory", writer=[NS])


@pytest.fixture
def seeded(writer, write, make_branch):
    """Baseline a=1, b=1, c=1 (all v1), and a fresh branch ``feature``."""
    for slug in "abc":
        write(writer, f"{NS}/order/{slug}", {"n": 1})
    return make_branch(writer)


# --- create -------------------------------------------------------------------


def test_create_forks_at_the_newest_baseline_changeset(writer, write, bwrite, make_branch):
    first = make_branch(writer, "empty-log")
    assert (first.fork_changeset_id, first.fork_seq) == (None, 0)
    newest = write(writer, f"{NS}/order/a", {"n": 1}).changeset
    bwrite(writer, first, f"{NS}/order/x", {"n": 1})  # a branch changeset is no fork point

    branch = make_branch(writer, "feature", comment="try things")
    assert branch.fork_changeset_id == newest.id
    assert branch.fork_seq == newest.seq
    assert branch.status == BranchStatus.OPEN
    assert branch.created_by == writer and branch.created_by_name == writer.username
    assert branch.comment == "try things"


@pytest.mark.parametrize(
    "name", ["", "Feature", "-x", ".x", "a b", "a/b", "x" * 64, "ünï", "a\n", "_x"]
)
def test_create_refuses_invalid_names(writer, name):
    with pytest.raises(ValidationFailed):
        branch_create(name=name, actor=writer)


@pytest.mark.parametrize("name", ["a", "0", "feature-1", "rel.2024_01", "x" * 63])
def test_create_accepts_valid_names(writer, name):
    assert branch_create(name=name, actor=writer).name == name


def test_names_are_never_reused(writer, make_branch):
    branch = make_branch(writer)
    with pytest.raises(BranchExists):
        make_branch(writer)
    branch_abandon(branch=branch, actor=writer)
    with pytest.raises(BranchExists):
        make_branch(writer)


def test_create_needs_writer_somewhere(make_user, namespace, superuser):
    reader = make_user("rita", reader=[NS])
    with pytest.raises(PermissionDenied):
        branch_create(name="nope", actor=reader)
    assert branch_create(name="root-made", actor=superuser).name == "root-made"


# --- merge --------------------------------------------------------------------


def test_clean_merge_lands_exactly_the_changed_entities_as_one_changeset(
    writer, bwrite, seeded, merger
):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    bwrite(writer, seeded, f"{NS}/order/b", None)
    bwrite(writer, seeded, f"{NS}/order/new", {"n": 9})
    bwrite(writer, seeded, f"{NS}/order/c", {"n": 5})
    bwrite(writer, seeded, f"{NS}/order/c", {"n": 1})  # changed back: nothing to land
    bwrite(writer, seeded, f"{NS}/order/tmp", {"n": 1})
    bwrite(writer, seeded, f"{NS}/order/tmp", None)  # created and deleted: nothing to land
    baseline_changesets = Changeset.objects.filter(branch="").count()

    result = branch_merge(branch=seeded, actor=merger, comment="ship it")

    changeset = result.changeset
    assert Changeset.objects.filter(branch="").count() == baseline_changesets + 1
    assert changeset.rpc == Rpc.MERGE_BRANCH and changeset.branch == ""
    assert changeset.author == merger and changeset.author_name == "mallory"
    assert changeset.comment == "ship it"
    assert changeset.message == "MergeBranch: 3 change(s)"
    revs = revisions_by_key(changeset)
    assert set(revs) == {key(f"{NS}/order/{s}") for s in ("a", "b", "new")}
    assert set(result.merged) == set(revs)
    assert_revision(revs[key(f"{NS}/order/a")], op="update", before={"n": 1}, after={"n": 2})
    assert_revision(revs[key(f"{NS}/order/b")], op="delete", before={"n": 1}, after=None)
    assert_revision(revs[key(f"{NS}/order/new")], op="create", before=None, after={"n": 9})
    assert revs[key(f"{NS}/order/a")].before_version == 1
    assert revs[key(f"{NS}/order/a")].after_version == 2
    # The merge is a baseline changeset like any other: journal entry, complete history.
    assert JournalEntry.objects.filter(changeset=changeset).exists()
    assert replayed_table() == entity_table()
    assert baseline.get(key(f"{NS}/order/a")).content == {"n": 2}
    assert baseline.get(key(f"{NS}/order/b")) is None
    # The branch is closed on that changeset; its overlay is gone, its changesets stay.
    seeded.refresh_from_db()
    assert seeded.status == BranchStatus.MERGED
    assert seeded.merged_changeset_id == changeset.id
    assert seeded.closed_at is not None
    assert not BranchEntity.objects.filter(branch=seeded).exists()
    assert Changeset.objects.filter(branch="feature").count() == 7
    assert result.branch.status == BranchStatus.MERGED


def test_merge_refuses_when_baseline_moved_and_writes_nothing(
    writer, write, bwrite, seeded, merger
):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    bwrite(writer, seeded, f"{NS}/order/b", None)
    bwrite(writer, seeded, f"{NS}/order/new", {"n": 1})
    bwrite(writer, seeded, f"{NS}/order/c", {"n": 2})
    write(writer, f"{NS}/order/a", {"n": 3})  # moved under an update
    write(writer, f"{NS}/order/b", {"n": 3})  # moved under a delete
    write(writer, f"{NS}/order/new", {"n": 3})  # created under a create
    before = log_snapshot()

    with pytest.raises(MergeConflict) as info:
        branch_merge(branch=seeded, actor=merger)

    assert info.value.status == 409
    assert info.value.conflicts == [
        {
            "namespace": NS,
            "kind": "order",
            "slug": "a",
            "reason": "baseline_moved",
            "op": "update",
            "base_version": 1,
            "baseline_version": 2,
        },
        {
            "namespace": NS,
            "kind": "order",
            "slug": "b",
            "reason": "baseline_moved",
            "op": "delete",
            "base_version": 1,
            "baseline_version": 2,
        },
        {
            "namespace": NS,
            "kind": "order",
            "slug": "new",
            "reason": "baseline_moved",
            "op": "create",
            "base_version": None,
            "baseline_version": 1,
        },
    ]
    assert_nothing_written(before)
    seeded.refresh_from_db()
    assert seeded.status == BranchStatus.OPEN
    assert len(overlay(seeded)) == 4


def test_baseline_delete_under_a_branch_update_conflicts(writer, write, bwrite, seeded, merger):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    write(writer, f"{NS}/order/a", None)
    with pytest.raises(MergeConflict) as info:
        branch_merge(branch=seeded, actor=merger)
    assert info.value.conflicts[0]["baseline_version"] is None


def test_equal_content_is_no_conflict(writer, write, bwrite, seeded, merger):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    bwrite(writer, seeded, f"{NS}/order/b", None)
    bwrite(writer, seeded, f"{NS}/order/c", {"n": 7})
    write(writer, f"{NS}/order/a", {"n": 2})  # baseline reached the branch's content
    write(writer, f"{NS}/order/b", None)  # ... and the branch's delete

    result = branch_merge(branch=seeded, actor=merger)

    assert result.merged == [key(f"{NS}/order/c")]
    assert set(revisions_by_key(result.changeset)) == {key(f"{NS}/order/c")}
    seeded.refresh_from_db()
    assert seeded.status == BranchStatus.MERGED


def test_baseline_changes_to_keys_the_branch_did_not_write_are_no_conflict(
    writer, write, bwrite, seeded, merger
):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    write(writer, f"{NS}/order/b", {"n": 2})
    write(writer, f"{NS}/order/z", {"n": 2})
    result = branch_merge(branch=seeded, actor=merger)
    assert result.merged == [key(f"{NS}/order/a")]
    assert baseline.get(key(f"{NS}/order/b")).content == {"n": 2}


def test_merge_dry_run_reports_and_writes_nothing(writer, bwrite, seeded, merger):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    bwrite(writer, seeded, f"{NS}/order/new", {"n": 2})
    before = log_snapshot()

    result = branch_merge(branch=seeded, actor=merger, dry_run=True)

    assert result.dry_run and result.changeset is None
    assert result.merged == [key(f"{NS}/order/a"), key(f"{NS}/order/new")]
    assert_nothing_written(before)
    seeded.refresh_from_db()
    assert seeded.status == BranchStatus.OPEN and len(overlay(seeded)) == 2


def test_dry_run_of_a_conflicting_merge_is_409_too(writer, write, bwrite, seeded, merger):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    write(writer, f"{NS}/order/a", {"n": 3})
    with pytest.raises(MergeConflict):
        branch_merge(branch=seeded, actor=merger, dry_run=True)


def test_merging_a_branch_with_nothing_to_land_closes_it_without_a_changeset(
    writer, bwrite, seeded
):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 1})
    before = log_snapshot()

    result = branch_merge(branch=seeded, actor=writer)

    assert result.changeset is None and result.merged == []
    assert_nothing_written(before)
    seeded.refresh_from_db()
    assert seeded.status == BranchStatus.MERGED and seeded.merged_changeset_id is None


def test_merged_and_abandoned_branches_cannot_be_merged_or_abandoned(writer, bwrite, seeded):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    branch_merge(branch=seeded, actor=writer)
    for action in (branch_merge, branch_abandon):
        with pytest.raises(BranchClosed):
            action(branch=Branch.objects.get(pk=seeded.pk), actor=writer)


def test_merge_needs_maintainer_in_protected_namespaces(
    make_user, protected_namespace, namespace, make_branch, bwrite
):
    wendy = make_user("wendy", writer=[NS, "acme.core"])
    branch = make_branch(wendy)
    # Branch writes need only writer, protected or not.
    bwrite(wendy, branch, "acme.core/rule/r1", {"on": True})
    bwrite(wendy, branch, f"{NS}/order/o1", {"n": 1})
    before = log_snapshot()

    with pytest.raises(PermissionDenied):
        branch_merge(branch=branch, actor=wendy)
    assert_nothing_written(before)

    maintainer = make_user("mo", writer=[NS], maintainer=["acme.core"])
    result = branch_merge(branch=branch, actor=maintainer)
    assert len(result.merged) == 2


def test_merge_needs_writer_in_unprotected_namespaces(make_user, writer, bwrite, seeded):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    reader = make_user("rita", reader=[NS])
    with pytest.raises(PermissionDenied):
        branch_merge(branch=seeded, actor=reader)
    stranger = make_user("sam")
    with pytest.raises(NotFound):
        branch_merge(branch=seeded, actor=stranger)


def test_permission_is_checked_before_conflicts_are_reported(
    make_user, writer, write, bwrite, seeded
):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    write(writer, f"{NS}/order/a", {"n": 3})
    with pytest.raises(PermissionDenied):
        branch_merge(branch=seeded, actor=make_user("rita", reader=[NS]))


def test_merge_over_the_op_limit_is_refused_before_the_plan_is_loaded(
    writer, bwrite, seeded, merger, monkeypatch, settings
):
    import branches.services.merge as services

    bwrite(writer, seeded, ops=[PutOp(key(f"{NS}/order/{s}"), {"n": 9}) for s in "abcd"])
    settings.ATLAS_MAX_BATCH_OPS = 2  # after the branch writes, which the limit binds too
    before = log_snapshot()

    def no_plan(**kwargs):
        raise AssertionError("the plan (with every content) was loaded")

    monkeypatch.setattr(services, "overlay_changes", no_plan)
    for dry_run in (False, True):
        with pytest.raises(PayloadTooLarge, match=r"4 ops; the limit is 2\.$"):
            branch_merge(branch=seeded, actor=merger, dry_run=dry_run)
    assert_nothing_written(before)
    assert Branch.objects.get(pk=seeded.pk).status == BranchStatus.OPEN


def test_a_merge_over_the_limit_is_refused_only_after_the_permission_check(
    make_user, writer, bwrite, seeded, settings
):
    """The 413 counts every change; a caller who may not land them learns no count."""
    bwrite(writer, seeded, ops=[PutOp(key(f"{NS}/order/{s}"), {"n": 9}) for s in "ab"])
    settings.ATLAS_MAX_BATCH_OPS = 1
    with pytest.raises(PermissionDenied):
        branch_merge(branch=seeded, actor=make_user("rita", reader=[NS]))


def test_merge_of_5000_changed_entities_costs_a_bounded_number_of_queries(
    writer, write, bwrite, make_branch, django_assert_max_num_queries
):
    from changesets.services.apply import changeset_apply

    changeset_apply(
        store=baseline,
        actor=writer,
        ops=[PutOp(key(f"{NS}/item/i{i:05d}"), {"i": i}) for i in range(3000)],
        rpc=Rpc.BATCH_MUTATE,
    )
    branch = make_branch(writer)
    ops = [PutOp(key(f"{NS}/item/i{i:05d}"), {"i": i, "v": 2}) for i in range(2000)]
    ops += [DeleteOp(key(f"{NS}/item/i{i:05d}")) for i in range(2000, 3000)]
    ops += [PutOp(key(f"{NS}/item/n{i:05d}"), {"i": i}) for i in range(2000)]
    bwrite(writer, branch, ops=ops)
    assert len(overlay(branch)) == 5000

    # Plan, namespaces, branch lock, baseline lock + re-plan, versions, three entity
    # statements, close, seq, changeset, revisions, journal, reload: about 15.
    with django_assert_max_num_queries(20):
        result = branch_merge(branch=branch, actor=writer)

    assert len(result.merged) == 5000
    assert result.changeset.op_count == 5000
    counts = Revision.objects.filter(changeset=result.changeset)
    assert counts.filter(op="update").count() == 2000
    assert counts.filter(op="delete").count() == 1000
    assert counts.filter(op="create").count() == 2000
    assert replayed_table() == entity_table()


def test_merge_replans_when_the_branch_moved_after_planning(
    writer, bwrite, seeded, merger, monkeypatch
):
    """A branch write between the plan and the locks: the merge plans again and lands it."""
    import branches.services.merge as services

    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    real = services.overlay_changes
    calls = []

    def plan_then_write(**kwargs):
        changes = real(**kwargs)
        if not calls:
            calls.append(1)
            bwrite(writer, seeded, f"{NS}/order/late", {"n": 1})
        return changes

    monkeypatch.setattr(services, "overlay_changes", plan_then_write)
    result = branch_merge(branch=seeded, actor=merger)
    assert set(result.merged) == {key(f"{NS}/order/a"), key(f"{NS}/order/late")}


# --- abandon ------------------------------------------------------------------


def test_abandon_drops_the_overlay_and_keeps_the_log(writer, bwrite, seeded):
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    bwrite(writer, seeded, f"{NS}/order/b", None)
    before = log_snapshot()

    branch = branch_abandon(branch=seeded, actor=writer)

    assert branch.status == BranchStatus.ABANDONED and branch.closed_at is not None
    assert not BranchEntity.objects.filter(branch=seeded).exists()
    after = log_snapshot()
    assert (after.changesets, after.revisions, after.entities) == (
        before.changesets,
        before.revisions,
        before.entities,
    )
    assert Changeset.objects.filter(branch="feature").count() == 2
    # Reads under the abandoned branch now see baseline.
    assert BranchStore(branch).get(key(f"{NS}/order/a")).content == {"n": 1}


def test_abandon_needs_someone_who_may_write_the_branch(make_user, writer, bwrite, seeded):
    """Issue 13 item 4: the writers of a branch abandon it (creator, members, maintainers
    of every namespace it touched, superusers); a mere writer of those namespaces no
    longer may (the old rule let any writer of every touched namespace abandon it)."""
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    with pytest.raises(PermissionDenied):
        branch_abandon(branch=seeded, actor=make_user("rita", reader=[NS]))
    with pytest.raises(PermissionDenied):
        branch_abandon(branch=seeded, actor=make_user("walt", writer=[NS]))
    maintainer = make_user("mo", maintainer=[NS])
    assert branch_abandon(branch=seeded, actor=maintainer).status == BranchStatus.ABANDONED


def test_nobody_but_creator_and_superusers_abandon_an_untouched_branch(
    make_user, writer, superuser
):
    branch = branch_create(name="idle", actor=writer)
    # Untouched: nobody else can even see it.
    with pytest.raises(NotFound):
        branch_abandon(branch=branch, actor=make_user("walt", writer=[NS]))
    assert branch_abandon(branch=branch, actor=superuser).status == BranchStatus.ABANDONED


# --- diff ---------------------------------------------------------------------


def test_diff_numbers_on_a_scripted_scenario(
    writer, write, bwrite, seeded, django_assert_max_num_queries
):
    # Branch: update a, delete b, create n1, create+delete tmp, update c and back.
    bwrite(writer, seeded, f"{NS}/order/a", {"n": 2})
    bwrite(writer, seeded, f"{NS}/order/b", None)
    bwrite(writer, seeded, f"{NS}/order/n1", {"n": 1})
    bwrite(writer, seeded, f"{NS}/order/tmp", {"n": 1})
    bwrite(writer, seeded, f"{NS}/order/tmp", None)
    bwrite(writer, seeded, f"{NS}/order/c", {"n": 2})
    bwrite(writer, seeded, f"{NS}/order/c", {"n": 1})
    # Baseline: moves a (conflict), creates n1 with the same content (no conflict),
    # writes z (not on the branch).
    write(writer, f"{NS}/order/a", {"n": 3})
    write(writer, f"{NS}/order/n1", {"n": 1})
    write(writer, f"{NS}/order/z", {"n": 1})

    with django_assert_max_num_queries(2):
        diff = branch_diff(branch=seeded, namespaces=None)

    assert diff.behind == 3
    assert diff.ahead == 7
    assert [
        (c.key.slug, c.op, c.base_version, c.baseline_version, c.conflict) for c in diff.changes
    ] == [
        ("a", "update", 1, 2, True),
        ("b", "delete", 1, 1, False),
    ]


def test_diff_is_limited_to_readable_namespaces(make_user, make_branch, bwrite, write):
    wendy = make_user("wendy", writer=[NS, "acme.billing"])
    branch = make_branch(wendy)
    bwrite(wendy, branch, f"{NS}/order/a", {"n": 1})
    bwrite(wendy, branch, "acme.billing/invoice/i", {"n": 1})
    write(wendy, "acme.billing/invoice/j", {"n": 1})
    diff = branch_diff(branch=branch, namespaces=[NS])
    assert [c.key.namespace for c in diff.changes] == [NS]
    assert (diff.behind, diff.ahead) == (0, 1)
