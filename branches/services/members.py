"""Branch members: who, besides the creator, may write a branch."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from atlas.exceptions import PermissionDenied
from branches.models import Branch, BranchMember
from branches.selectors import is_member, may_manage_members
from branches.services.visibility import require_visible as _require_visible
from branches.store import lock_branch_row, require_open

MSG_MANAGE_DENIED = (
    "Changing the members of branch {name!r} needs its creator, or the maintainer role in"
    " every namespace it touched."
)


def _lock_for_members(branch: Branch, actor: User, user: User) -> bool:
    """Lock the branch row, check it is open and ``actor`` manages its members;
    return whether ``user`` is a member."""
    locked = lock_branch_row(branch.pk)
    require_open(locked.name, locked.status)
    if not may_manage_members(
        actor, created_by_id=locked.created_by_id, namespaces=locked.namespaces
    ):
        raise PermissionDenied(MSG_MANAGE_DENIED.format(name=locked.name))
    return is_member(branch.pk, user)  # after the lock: a statement of its own


def branch_member_add(*, branch: Branch, user: User, actor: User) -> bool:
    """Let ``user`` write ``branch``; True when added, False when already a member.

    ``actor`` must be the creator, a superuser or a maintainer of every
    namespace the branch touched; the branch must be open (409). Membership is
    an addition to the namespace roles: the member still needs the writer role
    in each namespace they write. Takes the branch row lock, so it is ordered
    with the branch's writes.
    """
    _require_visible(branch, actor)
    with transaction.atomic(durable=True):
        if _lock_for_members(branch, actor, user):
            return False
        BranchMember.objects.create(
            branch=branch, user=user, added_by_name=actor.get_username(), added_at=timezone.now()
        )
    return True


def branch_member_remove(*, branch: Branch, user: User, actor: User) -> bool:
    """Take ``user``'s membership away; True when they were a member.

    Same rules as :func:`branch_member_add`. Under the branch row lock: a
    write by the removed member that queued behind it is refused (403).
    """
    _require_visible(branch, actor)
    with transaction.atomic(durable=True):
        if not _lock_for_members(branch, actor, user):
            return False
        BranchMember.objects.filter(branch=branch, user=user).delete()
    return True
