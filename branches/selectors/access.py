"""Who sees a branch and who writes it.

A branch is visible to its creator, its members, superusers, and anyone who
can read at least one namespace it has written (API.md, "Decisions that close
open points"). Invisible branches are reported as not found, exactly like
missing ones.

A branch is *written* (entity writes under its header, abandon) by its
creator, its members, superusers, and maintainers of every namespace it has
touched (API.md, "Limits and visibility (added)"): :func:`may_write`. The
rule is applied by :meth:`branches.store.BranchStore.lock` under the branch
row lock, so every write path obeys it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from branches.models import NAME_PATTERN, Branch, BranchMember
from entities import access
from entities.access import Role

User = access.User

_NAME_RE = re.compile(NAME_PATTERN)


def is_valid_name(value: object) -> bool:
    return isinstance(value, str) and _NAME_RE.fullmatch(value) is not None


def is_superuser(user: User) -> bool:
    return bool(getattr(user, "is_authenticated", False) and user.is_superuser)


def is_member(branch_id: int, user: User) -> bool:
    # django-stubs refuse None for ``user_id``; Django reads ``=None`` as IS NULL,
    # so an anonymous user (pk None) is a member of nothing.
    members = BranchMember.objects.filter(branch_id=branch_id, user_id=user.pk)  # type: ignore[misc]
    return members.exists()


def can_see(branch: Branch, user: User) -> bool:
    """Creator, member, superuser, or a reader of any namespace the branch touched."""
    if not getattr(user, "is_authenticated", False):
        return False
    if is_superuser(user):
        return True
    if branch.created_by_id is not None and branch.created_by_id == user.pk:
        return True
    readable = access.readable_namespaces(user)
    if readable is None or set(readable).intersection(branch.namespaces):
        return True
    return is_member(branch.pk, user)


def maintains_all(user: User, namespaces: Iterable[str]) -> bool:
    """``user`` is maintainer of every one of ``namespaces``, and there is at least one."""
    names = set(namespaces)
    return bool(names) and all(access.role_in(user, n) >= Role.MAINTAINER for n in names)


def may_write(
    user: User, *, branch_id: int, created_by_id: int | None, namespaces: Iterable[str]
) -> bool:
    """Who writes a branch: its creator, its members, superusers, and maintainers of
    every namespace in ``namespaces`` (those it touched, plus those being written).

    An addition to the namespace roles, never a substitute: each namespace
    written still needs the writer role there (the write service checks it).
    Membership is asked last, in a query of its own (the others cost none).
    """
    if not getattr(user, "is_authenticated", False):
        return False
    if is_superuser(user):
        return True
    if created_by_id is not None and created_by_id == user.pk:
        return True
    return maintains_all(user, namespaces) or is_member(branch_id, user)


def may_manage_members(user: User, *, created_by_id: int | None, namespaces: Iterable[str]) -> bool:
    """The creator, superusers, and maintainers of every namespace the branch touched."""
    if is_superuser(user):
        return True
    if created_by_id is not None and created_by_id == user.pk:
        return True
    return maintains_all(user, namespaces)
