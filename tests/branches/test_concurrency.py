"""Branches under real concurrency: threads, each with its own connection, real commits.

The interesting interleavings are forced, not left to timing: a barrier holds
each racer right after the merge has planned (outside its transaction) until
the other one is ready, so both go for the locks with a stale view.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import branches.services.members as member_services
import branches.services.merge as merge_services
from atlas.exceptions import PermissionDenied
from branches.exceptions import BranchClosed, MergeConflict
from branches.merge import MergeStore
from branches.models import Branch, BranchStatus
from branches.services import (
    branch_abandon,
    branch_create,
    branch_member_add,
    branch_member_remove,
    branch_merge,
)
from changesets.models import Changeset, Revision, Rpc
from entities.store import baseline
from tests.branches.conftest import NS, key, overlay
from tests.changesets.helpers import entity_table, replayed_table
from tests.changesets.test_concurrency import assert_no_errors, run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hold_after_plan(monkeypatch) -> Callable[[int], threading.Barrier]:
    """``hold_after_plan(2)``: each thread's first merge plan waits for ``parties`` threads.

    Returns the barrier, so a racer that does not plan a merge can meet it too.
    """

    def arm(parties: int) -> threading.Barrier:
        barrier = threading.Barrier(parties, timeout=10)
        real = merge_services.overlay_changes
        local = threading.local()

        def planned(**kwargs: Any):
            changes = real(**kwargs)
            if not getattr(local, "held", False):
                local.held = True
                barrier.wait()
            return changes

        monkeypatch.setattr(merge_services, "overlay_changes", planned)
        return barrier

    return arm


@pytest.fixture
def merge_locked(monkeypatch) -> threading.Event:
    """Set once a merge holds its locks; the merge then lingers a moment before writing,
    so a racer started on the event really queues behind those locks."""
    locked = threading.Event()
    real = MergeStore.lock

    def lock(self, keys, **kw):
        rows = real(self, keys, **kw)
        locked.set()
        time.sleep(0.3)
        return rows

    monkeypatch.setattr(MergeStore, "lock", lock)
    return locked


@pytest.fixture
def branch_with_changes(writer, write, bwrite) -> Branch:
    for slug in "abc":
        write(writer, f"{NS}/order/{slug}", {"n": 1})
    branch = branch_create(name="feature", actor=writer)
    bwrite(writer, branch, f"{NS}/order/a", {"n": 2})
    bwrite(writer, branch, f"{NS}/order/b", None)
    bwrite(writer, branch, f"{NS}/order/new", {"n": 1})
    return branch


def fresh(branch: Branch) -> Branch:
    return Branch.objects.get(pk=branch.pk)


def test_two_concurrent_merges_of_one_branch_exactly_one_wins(
    writer, make_user, branch_with_changes, hold_after_plan
):
    other = make_user("mallory", writer=[NS])
    hold_after_plan(2)

    outcomes = run_in_threads(
        lambda: branch_merge(branch=fresh(branch_with_changes), actor=writer),
        lambda: branch_merge(branch=fresh(branch_with_changes), actor=other),
    )

    wins = [o for o in outcomes if not isinstance(o, BaseException)]
    losses = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(wins) == 1 and len(losses) == 1, outcomes
    assert isinstance(losses[0], BranchClosed) and losses[0].status == 409
    merges = Changeset.objects.filter(rpc=Rpc.MERGE_BRANCH)
    assert merges.count() == 1
    assert merges.get().op_count == 3
    branch = fresh(branch_with_changes)
    assert branch.status == BranchStatus.MERGED
    assert branch.merged_changeset_id == merges.get().id
    assert replayed_table() == entity_table()


def test_merge_and_abandon_race_exactly_one_closes(writer, branch_with_changes, hold_after_plan):
    barrier = hold_after_plan(2)  # the merge has planned when the abandon starts

    def abandon():
        barrier.wait()
        return branch_abandon(branch=fresh(branch_with_changes), actor=writer)

    outcomes = run_in_threads(
        lambda: branch_merge(branch=fresh(branch_with_changes), actor=writer), abandon
    )
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], BranchClosed), outcomes
    branch = fresh(branch_with_changes)
    merged = Changeset.objects.filter(rpc=Rpc.MERGE_BRANCH).exists()
    assert branch.status == (BranchStatus.MERGED if merged else BranchStatus.ABANDONED)
    assert overlay(branch) == {}


@pytest.mark.parametrize("round_", range(3))
def test_a_branch_write_racing_a_merge_is_merged_or_refused_never_lost(
    writer, bwrite, branch_with_changes, hold_after_plan, round_
):
    """The write lands before the merge locks (and is merged), or after it (409)."""
    hold_after_plan(2)
    late = f"{NS}/order/late"

    def write_late():
        # Let the merge plan first, then write while it goes for the locks.
        merge_services.overlay_changes(branch=fresh(branch_with_changes))
        return bwrite(writer, fresh(branch_with_changes), late, {"n": round_})

    outcomes = run_in_threads(
        lambda: branch_merge(branch=fresh(branch_with_changes), actor=writer), write_late
    )

    merge, written = outcomes
    assert not isinstance(merge, BaseException), merge
    on_baseline = baseline.get(key(late))
    if isinstance(written, BaseException):
        assert isinstance(written, BranchClosed), written
        assert on_baseline is None
        assert key(late) not in merge.merged
    else:
        assert on_baseline is not None and on_baseline.content == {"n": round_}
        assert key(late) in merge.merged
    assert replayed_table() == entity_table()


def test_a_branch_write_queued_behind_a_merge_is_refused(
    writer, bwrite, branch_with_changes, merge_locked
):
    def write_when_locked():
        assert merge_locked.wait(10)
        return bwrite(writer, fresh(branch_with_changes), f"{NS}/order/late", {"n": 1})

    merge, written = run_in_threads(
        lambda: branch_merge(branch=fresh(branch_with_changes), actor=writer), write_when_locked
    )

    assert not isinstance(merge, BaseException), merge
    assert isinstance(written, BranchClosed), written
    assert baseline.get(key(f"{NS}/order/late")) is None
    assert not Changeset.objects.filter(branch="feature", seq__gt=merge.changeset.seq).exists()


def test_a_baseline_write_queued_behind_a_merge_lands_after_it(
    writer, write, branch_with_changes, merge_locked
):
    def write_when_locked():
        assert merge_locked.wait(10)
        return write(writer, f"{NS}/order/a", {"n": 99})

    merge, written = run_in_threads(
        lambda: branch_merge(branch=fresh(branch_with_changes), actor=writer), write_when_locked
    )

    assert_no_errors([merge, written])
    assert written.changeset.seq > merge.changeset.seq
    assert written.results[0].version == 3  # on top of the merged v2
    assert baseline.get(key(f"{NS}/order/a")).content == {"n": 99}
    assert replayed_table() == entity_table()


def test_a_baseline_write_racing_a_merge_is_never_overwritten(
    writer, write, branch_with_changes, hold_after_plan
):
    """Baseline moves ``a`` while the merge goes for its locks: either the merge
    saw it (409) or it lands after the merge; the baseline write survives."""
    hold_after_plan(2)

    def baseline_write():
        merge_services.overlay_changes(branch=fresh(branch_with_changes))  # meet the merge
        return write(writer, f"{NS}/order/a", {"n": 99})

    merge, written = run_in_threads(
        lambda: branch_merge(branch=fresh(branch_with_changes), actor=writer), baseline_write
    )

    assert not isinstance(written, BaseException), written
    assert baseline.get(key(f"{NS}/order/a")).content == {"n": 99}
    if isinstance(merge, BaseException):
        assert isinstance(merge, MergeConflict), merge
        assert fresh(branch_with_changes).status == BranchStatus.OPEN
    else:
        revision = Revision.objects.get(changeset=merge.changeset, slug="a")
        assert revision.after == {"n": 2}
        later = Revision.objects.filter(slug="a", branch="", seq__gt=merge.changeset.seq)
        assert later.get().after == {"n": 99}
    assert replayed_table() == entity_table()


def test_concurrent_writes_to_one_branch_both_land(make_user, bwrite):
    wendy = make_user("wendy", writer=[NS, "acme.billing"])
    branch = branch_create(name="busy", actor=wendy)
    barrier = threading.Barrier(4, timeout=10)

    def writer_for(path: str):
        def run():
            barrier.wait()
            return bwrite(wendy, fresh(branch), path, {"n": 1})

        return run

    outcomes = run_in_threads(
        writer_for(f"{NS}/order/x"),
        writer_for("acme.billing/invoice/y"),
        writer_for(f"{NS}/order/z"),
        writer_for("acme.billing/invoice/w"),
    )

    assert_no_errors(outcomes)
    assert len(overlay(branch)) == 4
    # Every writer saw the namespaces of those before it: none is lost.
    assert fresh(branch).namespaces == ["acme.billing", NS]
    assert Changeset.objects.filter(branch="busy").count() == 4


def test_a_members_write_queued_behind_their_removal_is_refused(
    writer, make_user, bwrite, branch_with_changes, monkeypatch
):
    """The writer rule is judged under the branch row lock: a write that waited for a
    removal's lock sees the removal, never the membership it read before."""
    walt = make_user("walt", writer=[NS])
    branch_member_add(branch=branch_with_changes, user=walt, actor=writer)
    locked = threading.Event()
    real = member_services._lock_for_members

    def lock_and_linger(*args: Any) -> bool:
        member = real(*args)
        locked.set()
        time.sleep(0.3)
        return member

    monkeypatch.setattr(member_services, "_lock_for_members", lock_and_linger)

    def write_when_locked():
        assert locked.wait(10)
        return bwrite(walt, fresh(branch_with_changes), f"{NS}/order/late", {"n": 1})

    removed, written = run_in_threads(
        lambda: branch_member_remove(branch=fresh(branch_with_changes), user=walt, actor=writer),
        write_when_locked,
    )

    assert removed is True
    assert isinstance(written, PermissionDenied), written
    assert not Changeset.objects.filter(branch="feature", author_name="walt").exists()
