"""Branch lifecycle: cut a branch from baseline, abandon it.

The merge, the other way a branch closes, is :mod:`branches.services.merge`.
"""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from atlas.exceptions import PermissionDenied, ValidationFailed
from branches.exceptions import BranchExists
from branches.models import MSG_NAME, Branch, BranchStatus
from branches.selectors import is_superuser, is_valid_name
from branches.services.visibility import require_visible as _require_visible
from branches.store import close_branch, lock_branch_row, require_open, require_writer
from changesets.models import BASELINE, Changeset
from entities import access
from entities.access import Role

# The same words whoever holds the name and whatever it touched: a caller who
# cannot see the branch learns only that the name is taken.
MSG_NAME_TAKEN = "The branch name {name!r} is taken (branch names are never reused)."


def _can_write_somewhere(actor: User) -> bool:
    if is_superuser(actor):
        return True
    roles = access.roles_for(actor)
    return roles.floor >= Role.WRITER or any(r >= Role.WRITER for r in roles.grants.values())


def branch_create(*, name: str, actor: User, comment: str = "") -> Branch:
    """Cut a branch from baseline as it is now.

    Any user with the writer role in some namespace may create one (API.md).
    The fork point is the newest baseline changeset (``fork_seq`` 0 on an
    empty log); reads under the branch see baseline *as it is now*, so the
    fork is a coordinate for "how far behind", not a snapshot. Names are
    never reused: the log refers to branches by name, so a taken name is 409
    whatever the old branch's status, with the same detail whether or not the
    caller can see the branch (no owner, no namespace).
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
                base_changeset=fork,
                base_seq=fork.seq if fork else 0,
            )
    except IntegrityError as exc:
        raise BranchExists(MSG_NAME_TAKEN.format(name=name)) from exc


def branch_abandon(*, branch: Branch, actor: User) -> Branch:
    """Abandon an open branch: its overlay goes, its changesets stay in the log.

    Who may: whoever may write the branch (its creator, a member, a superuser,
    a maintainer of every namespace it touched). Locks the branch row first
    (as every branch write does), so no branch write can land after the
    abandon commits; those that queued behind it find the branch closed (409).
    """
    _require_visible(branch, actor)
    with transaction.atomic(durable=True):
        locked = lock_branch_row(branch.pk)
        require_open(locked.name, locked.status)
        require_writer(actor, locked)
        close_branch(branch.pk, status=BranchStatus.ABANDONED, now=timezone.now())
    branch.refresh_from_db()
    return branch
