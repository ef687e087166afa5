"""Branch writes: create, merge, abandon.

Entity writes *on* a branch are not here: they go through the one write path,
``changesets.services.changeset_apply``, with a :class:`branches.store.BranchStore`.
The merge goes through it too (with :class:`branches.merge.MergeStore`), so it
is an ordinary baseline changeset with a journal entry and a place in the
change feed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from atlas.exceptions import Conflict, NotFound, PermissionDenied, ValidationFailed
from branches.exceptions import BranchExists, PlanMoved
from branches.merge import MergeStore, merge_conflict
from branches.models import MSG_NAME, Branch, BranchStatus
from branches.selectors import OverlayChange, is_valid_name, overlay_changes
from branches.store import close_branch, lock_branch_row, require_open
from changesets.models import BASELINE, Changeset, Revision, Rpc
from changesets.ops import DeleteOp, PutOp, WriteOp
from changesets.services import changeset_apply
from entities import access
from entities.access import Role
from entities.models import Namespace
from entities.store import EntityKey

# How often a merge re-plans when branch or baseline writes keep slipping in
# between its plan and its locks. Each attempt is cheap; running out is a 409.
MERGE_ATTEMPTS = 5


@dataclass
class MergeResult:
    """What :func:`branch_merge` did (or, on a dry run, would do)."""

    branch: Branch
    changeset: Changeset | None
    merged: list[EntityKey] = field(default_factory=list)
    revisions: list[Revision] = field(default_factory=list)
    dry_run: bool = False


def _can_write_somewhere(actor: AbstractBaseUser) -> bool:
    roles = access.roles_for(actor)
    return roles.floor >= Role.WRITER or any(r >= Role.WRITER for r in roles.grants.values())


def branch_create(*, name: str, actor: AbstractBaseUser, comment: str = "") -> Branch:
    """Cut a branch from baseline as it is now.

    Any user with the writer role in some namespace may create one (API.md).
    The fork point is the newest baseline changeset (``fork_seq`` 0 on an
    empty log); reads under the branch see baseline *as it is now*, so the
    fork is a coordinate for "how far behind", not a snapshot. Names are
    never reused: the log refers to branches by name, so a taken name is 409
    whatever the old branch's status.
    """
    if not is_valid_name(name):
        raise ValidationFailed(
            MSG_NAME, pointer="/name", errors=[{"pointer": "/name", "detail": MSG_NAME}]
        )
    if not _can_write_somewhere(actor):
        raise PermissionDenied("Creating a branch needs the writer role in some namespace.")
    fork = Changeset.objects.filter(branch=BASELINE).order_by("-seq").only("id", "seq").first()
    try:
        with transaction.atomic(durable=True):
            return Branch.objects.create(
                name=name,
                comment=comment or "",
                created_by=actor if getattr(actor, "pk", None) else None,
                created_by_name=actor.get_username(),
                created_at=timezone.now(),
                fork_changeset=fork,
                fork_seq=fork.seq if fork else 0,
            )
    except IntegrityError as exc:
        raise BranchExists(f"A branch named {name!r} exists (names are never reused).") from exc


def _require_close_permission(
    actor: AbstractBaseUser, branch: Branch, namespaces: Iterable[str]
) -> None:
    """Closing a branch (abandon, or a merge that lands nothing) needs its creator,
    or the writer role in every namespace it touched (superusers have it everywhere)."""
    if branch.created_by_id is not None and branch.created_by_id == actor.pk:
        return
    names = sorted(namespaces)
    if access.is_superuser(actor) or (
        names and all(access.role_in(actor, n) >= Role.WRITER for n in names)
    ):
        return
    raise PermissionDenied(
        f"Closing branch {branch.name!r} needs its creator, or the writer role in every"
        " namespace it touched."
    )


def branch_abandon(*, branch: Branch, actor: AbstractBaseUser) -> Branch:
    """Abandon an open branch: its overlay goes, its changesets stay in the log.

    Locks the branch row first (as every branch write does), so no branch
    write can land after the abandon commits; those that queued behind it
    find the branch closed (409).
    """
    with transaction.atomic(durable=True):
        name, status, namespaces = lock_branch_row(branch.pk)
        require_open(name, status)
        _require_close_permission(actor, branch, namespaces)
        close_branch(branch.pk, status=BranchStatus.ABANDONED, now=timezone.now())
    branch.refresh_from_db()
    return branch


def _merge_ops(plan: Iterable[OverlayChange]) -> list[WriteOp]:
    return [
        DeleteOp(c.key, missing_ok=True) if c.deleted else PutOp(c.key, c.content or {})
        for c in plan
    ]


def _require_merge_permission(actor: AbstractBaseUser, plan: Iterable[OverlayChange]) -> None:
    """Baseline write rules (writer; maintainer where protected) on the plan's namespaces."""
    names = sorted({c.key.namespace for c in plan})
    namespaces = {ns.name: ns for ns in Namespace.objects.filter(name__in=names)}
    for name in names:
        if name not in namespaces:  # pragma: no cover - overlay rows PROTECT their namespace
            raise NotFound(f"Namespace {name!r} not found.")
    access.require_write(actor, namespaces, branch=BASELINE)


def _close_empty_merge(branch: Branch, actor: AbstractBaseUser) -> None:
    """Mark merged a branch with nothing to land (no changeset: invariant 3)."""
    with transaction.atomic(durable=True):
        name, status, namespaces = lock_branch_row(branch.pk)
        require_open(name, status)
        if overlay_changes(branch=branch):
            raise PlanMoved()
        _require_close_permission(actor, branch, namespaces)
        close_branch(branch.pk, status=BranchStatus.MERGED, now=timezone.now())


def branch_merge(
    *, branch: Branch, actor: AbstractBaseUser, dry_run: bool = False, comment: str = ""
) -> MergeResult:
    """Land an open branch on baseline as one changeset (rpc ``MergeBranch``).

    1. Plan, outside any transaction: the overlay keys whose state differs
       from baseline's (:func:`branches.selectors.overlay_changes`).
    2. A key where baseline moved since the branch first wrote it (its
       version is no longer ``base_version``) and does not already hold the
       branch's state is a conflict: 409 listing them all, nothing written.
       The caller must have baseline write rights on those namespaces first
       (403/404 before 409), so conflicts never reveal unwritable keys.
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
    """
    for _ in range(MERGE_ATTEMPTS):
        require_open(branch.name, branch.status)
        plan = overlay_changes(branch=branch, with_content=True)
        conflicts = [c for c in plan if c.conflict]
        if conflicts:
            _require_merge_permission(actor, plan)
            raise merge_conflict(branch.name, conflicts)
        try:
            if not plan:
                if not dry_run:
                    _close_empty_merge(branch, actor)
                    branch.refresh_from_db()
                return MergeResult(branch=branch, changeset=None, dry_run=dry_run)
            result = changeset_apply(
                store=MergeStore(branch, plan),
                actor=actor,
                ops=_merge_ops(plan),
                rpc=Rpc.MERGE_BRANCH,
                comment=comment,
                dry_run=dry_run,
            )
        except PlanMoved:
            continue
        if result.changeset is None and not dry_run:  # pragma: no cover - plan said it moves
            try:
                _close_empty_merge(branch, actor)
            except PlanMoved:
                continue
        if not dry_run:
            branch.refresh_from_db()
        return MergeResult(
            branch=branch,
            changeset=result.changeset,
            merged=[EntityKey(r.namespace, r.kind, r.slug) for r in result.revisions],
            revisions=result.revisions,
            dry_run=dry_run,
        )
    raise Conflict(f"Branch {branch.name!r} kept changing while it was being merged; retry.")
