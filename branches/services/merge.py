"""The merge: land an open branch on baseline as one changeset (:func:`branch_merge`).

It goes through the one write path, ``changesets.services.apply.changeset_apply``,
with a :class:`branches.merge.MergeStore`, so it is an ordinary baseline
changeset with a journal entry and a place in the change feed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from atlas.exceptions import Conflict, PermissionDenied, ValidationFailed
from branches.exceptions import MergeConflict, PlanMoved
from branches.keymerge import Resolution, Triple, baseline_contents_at, merge_all
from branches.merge import MergeStore, merge_conflict
from branches.models import Branch, BranchStatus
from branches.selectors import OverlayChange, overlay_change_counts, overlay_changes
from branches.services.visibility import require_visible as _require_visible
from branches.store import (
    LockedBranch,
    close_branch,
    lock_branch_row,
    require_open,
    require_writer,
)
from changesets.merge3 import Granularity
from changesets.models import BASELINE, Changeset, Revision, Rpc
from changesets.ops import DeleteOp, PutOp, WriteOp
from changesets.services.apply import changeset_apply, check_op_limit
from entities import access
from entities.access import Role
from entities.models import Namespace
from entities.store import EntityKey, StoredEntity

# How often a merge re-plans when branch or baseline writes keep slipping in
# between its plan and its locks. Each attempt is cheap; running out is a 409.
MERGE_ATTEMPTS = 5

MSG_RESOLUTIONS_NEED_KEY = 'Resolutions settle key-level conflicts: send "granularity": "key".'


@dataclass
class MergeResult:
    """What :func:`branch_merge` did (or, on a dry run, would do)."""

    branch: Branch
    changeset: Changeset | None
    merged: list[EntityKey] = field(default_factory=list)
    revisions: list[Revision] = field(default_factory=list)
    dry_run: bool = False


def _require_close_permission(actor: User, branch: LockedBranch) -> None:
    """A merge that lands nothing (it only closes the branch) needs someone who may
    write the branch, or merge rights: the writer role in every namespace it touched."""
    names = branch.namespaces
    if names and all(access.role_in(actor, n) >= Role.WRITER for n in names):
        return
    require_writer(actor, branch)


def _merge_ops(plan: Iterable[OverlayChange]) -> list[WriteOp]:
    return [
        DeleteOp(c.key, missing_ok=True) if c.deleted else PutOp(c.key, c.content or {})
        for c in plan
    ]


def _require_merge_permission(actor: User, name: str, landing: Iterable[str]) -> None:
    """Baseline write rules (writer; maintainer where protected) on the namespaces a
    merge lands in: 403, naming only the namespaces the caller can read.

    The branch is visible to the caller, but its changes may lie in namespaces
    the caller cannot read (a member wrote them): those are counted, not named.
    """
    names = sorted(set(landing))
    if not names:
        return
    protected = dict(Namespace.objects.filter(name__in=names).values_list("name", "protected"))
    denied: list[str] = []
    unreadable = 0
    for ns in names:
        role = access.role_in(actor, ns)
        namespace = Namespace(name=ns, protected=protected.get(ns, False))
        needed = access.required_write_role(namespace, branch=BASELINE)
        if role < Role.READER:
            unreadable += 1
        elif role < needed:
            denied.append(f"{ns!r} (needs {needed.name.lower()})")
    if unreadable:
        denied.append(f"{unreadable} namespace{'' if unreadable == 1 else 's'} you cannot read")
    if denied:
        raise PermissionDenied(
            f"Merging branch {name!r} lands changes you may not write: in {' and '.join(denied)}."
        )


def _require_within_limit(name: str, n: int) -> None:
    """A merge is one changeset: at most ``ATLAS_MAX_BATCH_OPS`` ops, else 413."""
    check_op_limit(n, what=f"Merging branch {name!r}")


def _close_empty_merge(
    branch: Branch, actor: User, plan: Sequence[OverlayChange] | None = None
) -> None:
    """Mark merged a branch with nothing to land (no changeset: invariant 3).

    ``plan``: a key-level merge whose every change resolved to baseline's
    state lands nothing either; its branch closes if its changes are still
    the planned ones (else :class:`PlanMoved`).
    """
    expected = {c.key: c.changeset_id for c in plan or ()}
    with transaction.atomic(durable=True):
        locked = lock_branch_row(branch.pk)
        require_open(locked.name, locked.status)
        if {c.key: c.changeset_id for c in overlay_changes(branch=branch)} != expected:
            raise PlanMoved()
        _require_close_permission(actor, locked)
        close_branch(branch.pk, status=BranchStatus.MERGED, now=timezone.now())


def _checked_merge_plan(
    branch: Branch, actor: User, *, key_level: bool = False
) -> list[OverlayChange]:
    """Steps 0-2 of :func:`branch_merge`: the plan, once the caller may land all of it.

    Refusals come in the order that reveals least: permissions and the op
    limit on the counts (no content read), again on the plan (a branch write
    may have slipped in between), and only then conflicts, so a conflict
    never names a key the caller may not write.
    """
    require_open(branch.name, branch.status)
    counts = overlay_change_counts(branch=branch)
    _require_merge_permission(actor, branch.name, counts)
    _require_within_limit(branch.name, sum(counts.values()))
    plan = overlay_changes(branch=branch, with_content=True)
    _require_merge_permission(actor, branch.name, {c.key.namespace for c in plan} - {*counts})
    _require_within_limit(branch.name, len(plan))
    conflicts = [c for c in plan if c.conflict]
    if conflicts and not key_level:
        raise merge_conflict(branch.name, conflicts)
    return plan


def _land_merge(
    branch: Branch,
    actor: User,
    plan: list[OverlayChange],
    *,
    comment: str,
    dry_run: bool,
    provenance: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None],
    key_level: Sequence[Resolution] | None = None,
) -> MergeResult:
    """Steps 3-4 of :func:`branch_merge`: land the plan as one changeset, or close.

    ``key_level`` (the resolutions of a key-level merge): the ops are decided
    under the locks by :func:`_key_merge_planner` instead of taken from the plan.
    Raises :class:`~branches.exceptions.PlanMoved` when the plan no longer
    holds under the locks; the caller plans again.
    """
    if not plan:
        if not dry_run:
            _close_empty_merge(branch, actor)
            branch.refresh_from_db()
        return MergeResult(branch=branch, changeset=None, dry_run=dry_run)
    store = MergeStore(branch, plan, key_level=key_level is not None)
    ops: list[WriteOp]
    keys: list[EntityKey]
    planner: Callable[[Mapping[EntityKey, StoredEntity]], list[WriteOp]] | None
    if key_level is None:
        ops, keys, planner = _merge_ops(plan), [], None
    else:
        ops, keys, planner = [], [c.key for c in plan], _key_merge_planner(branch, plan, key_level)
    result = changeset_apply(
        store=store,
        actor=actor,
        ops=ops,
        keys=keys,
        plan=planner,
        rpc=Rpc.MERGE_BRANCH,
        comment=comment,
        dry_run=dry_run,
        metadata=provenance[0],
        context=provenance[1],
    )
    if result.changeset is None and not dry_run:  # a key-level merge that kept baseline
        _close_empty_merge(branch, actor, plan)
    if not dry_run:
        branch.refresh_from_db()
    return MergeResult(
        branch=branch,
        changeset=result.changeset,
        merged=[EntityKey(r.namespace, r.kind, r.slug) for r in result.revisions],
        revisions=result.revisions,
        dry_run=dry_run,
    )


def _key_merge_planner(
    branch: Branch, plan: Sequence[OverlayChange], resolutions: Sequence[Resolution]
) -> Callable[[Mapping[EntityKey, StoredEntity]], list[WriteOp]]:
    """The plan of a key-level merge, run by the write service under the merge's locks.

    Per planned key (:mod:`branches.keymerge`): base = baseline at the
    branch's ``base_version`` (read only where baseline moved: elsewhere base
    is baseline now), ours = the locked baseline row, theirs = the branch's
    state (unchanged since planning: the merge store checked that under the
    branch row lock). Conflicts left after ``resolutions`` → 409 listing them
    all; otherwise one op per key whose merge differs from baseline.
    """

    def planner(current: Mapping[EntityKey, StoredEntity]) -> list[WriteOp]:
        moved = {
            c.key: c.base_version
            for c in plan
            if c.base_version is not None
            and (current[c.key].version if c.key in current else None) != c.base_version
        }
        bases = baseline_contents_at(moved)
        triples = []
        for change in plan:
            now = current.get(change.key)
            ours = now.content if now is not None else None
            now_version = now.version if now is not None else None
            base = ours if change.base_version == now_version else bases.get(change.key)
            theirs = None if change.deleted else change.content
            triples.append(Triple(change.key, base, ours, theirs, current=ours))
        ops, conflicts = merge_all(triples, granularity="key", resolutions=resolutions)
        if conflicts:
            raise MergeConflict(
                f"Branch {branch.name!r} and baseline changed {len(conflicts)} pointer"
                f"{'' if len(conflicts) == 1 else 's'} differently; resolve them to merge.",
                conflicts=conflicts,
            )
        return ops

    return planner


def _key_level_resolutions(
    granularity: Granularity, resolutions: Sequence[Resolution]
) -> list[Resolution] | None:
    """The resolutions of a key-level merge; ``None`` for an entity-level one.

    Resolutions settle key-level conflicts only: sent without ``granularity="key"``, 422.
    """
    if resolutions and granularity != "key":
        raise ValidationFailed(
            MSG_RESOLUTIONS_NEED_KEY,
            pointer="/resolutions",
            errors=[{"pointer": "/resolutions", "detail": MSG_RESOLUTIONS_NEED_KEY}],
        )
    return list(resolutions) if granularity == "key" else None


def _merge_until_the_plan_holds(
    branch: Branch,
    actor: User,
    *,
    comment: str,
    dry_run: bool,
    provenance: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None],
    key_level: list[Resolution] | None,
) -> MergeResult:
    """Steps 1-4 of :func:`branch_merge`, planned again while the plan moves under the locks.

    Each attempt plans outside any transaction (:func:`_checked_merge_plan`) and
    lands under the locks (:func:`_land_merge`); a plan that no longer holds there
    (:class:`~branches.exceptions.PlanMoved`) is made again, at most
    :data:`MERGE_ATTEMPTS` times, then 409.
    """
    for _ in range(MERGE_ATTEMPTS):
        plan = _checked_merge_plan(branch, actor, key_level=key_level is not None)
        try:
            return _land_merge(
                branch,
                actor,
                plan,
                comment=comment,
                dry_run=dry_run,
                provenance=provenance,
                key_level=key_level,
            )
        except PlanMoved:
            continue
    raise Conflict(f"Branch {branch.name!r} kept changing while it was being merged; retry.")


def branch_merge(
    *,
    branch: Branch,
    actor: User,
    dry_run: bool = False,
    comment: str = "",
    metadata: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
    granularity: Granularity = "entity",
    resolutions: Sequence[Resolution] = (),
) -> MergeResult:
    """Land an open branch on baseline as one changeset (rpc ``MergeBranch``).

    0. The caller must see the branch (404). Counted first, without any
       content (:func:`branches.selectors.overlay_change_counts`): the
       caller needs baseline write rights in every namespace the merge lands
       in (403, naming none the caller cannot read), and the merge is one
       changeset, so at most ``ATLAS_MAX_BATCH_OPS`` ops (413). Both before
       anything is loaded or locked; a dry run is refused the same way.
    1. Plan, outside any transaction: the overlay keys whose state differs
       from baseline's (:func:`branches.selectors.overlay_changes`). The
       checks of step 0 run again on the plan (a branch write may have
       slipped in); step 3 makes sure the plan still holds under the locks.
    2. A key where baseline moved since the branch first wrote it (its
       version is no longer ``base_version``) and does not already hold the
       branch's state is a conflict: 409 listing them all, nothing written.
       The permission checks came first, so conflicts never reveal
       unwritable keys.
    3. ``changeset_apply`` on a :class:`~branches.merge.MergeStore` with one
       put or delete per planned key, author = ``actor``. In its one
       transaction the store locks the branch row (a concurrent merge waits,
       then finds the branch merged: 409), locks baseline rows and re-plans
       against them (conflicts → 409; a different plan → step 1 again), and
       next to the baseline writes marks the branch merged on this changeset
       and deletes its overlay. The service checks permissions like any
       baseline write: writer, maintainer in protected namespaces.
    4. A plan with nothing to land closes the branch without a changeset.

    A dry run goes through the same checks and locks and writes nothing.

    ``granularity="key"``: step 2 refuses nothing; step 3's plan is the
    three-way merge of each key under the locks (:func:`_key_merge_planner`),
    conflicts only where both sides changed one pointer differently and no
    resolution settles it (409, ``reason: key_conflict``). A key whose merge
    equals baseline lands nothing; when no key lands, the branch closes
    without a changeset.
    """
    _require_visible(branch, actor)
    key_level = _key_level_resolutions(granularity, resolutions)
    return _merge_until_the_plan_holds(
        branch,
        actor,
        comment=comment,
        dry_run=dry_run,
        provenance=(metadata, context),
        key_level=key_level,
    )
