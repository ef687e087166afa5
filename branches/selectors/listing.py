"""Lists and single reads of branches, their members and their changesets.

Every read here shows only branches the caller can see (:mod:`branches.selectors.access`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.contrib.auth import get_user_model
from django.contrib.auth import models as auth_models
from django.db.models import Q, QuerySet

from branches.models import Branch, BranchMember
from branches.selectors.access import User, can_see, is_superuser, is_valid_name
from changesets.models import Changeset
from entities import access


def member_names(branches: Iterable[Branch]) -> dict[int, list[str]]:
    """Usernames of each branch's members, sorted; one query for a page of branches."""
    ids = [b.pk for b in branches]
    names: dict[int, list[str]] = {i: [] for i in ids}
    rows = (
        BranchMember.objects.filter(branch_id__in=ids)
        .order_by("branch_id", "user__username")
        .values_list("branch_id", "user__username")
    )
    for branch_id, username in rows:
        names[branch_id].append(username)
    return names


def branch_get(*, name: str, user: User) -> Branch | None:
    """The named branch if ``user`` can see it, else ``None`` (404 for the caller)."""
    if not is_valid_name(name):
        return None
    branch = Branch.objects.filter(name=name).first()
    if branch is None or not can_see(branch, user):
        return None
    return branch


def visible_branches(*, user: User) -> QuerySet[Branch]:
    """Every branch ``user`` can see, by name."""
    qs = Branch.objects.order_by("name")
    if is_superuser(user):
        return qs
    readable = access.readable_namespaces(user)
    if readable is None:
        return qs
    # Membership as a subquery, not a join: a join would repeat a branch per member.
    # ``type: ignore``: as in is_member, the stubs refuse the anonymous user's None pk.
    memberships = BranchMember.objects.filter(user_id=user.pk).values("branch_id")  # type: ignore[misc]
    return qs.filter(
        Q(created_by_id=user.pk) | Q(namespaces__overlap=readable) | Q(pk__in=memberships)
    )


def branch_fresh(*, branch: Branch) -> Branch:
    """``branch`` as stored now (after a service changed it under its row lock)."""
    return Branch.objects.get(pk=branch.pk)


def user_by_username(username: str) -> auth_models.User | None:
    """The user named ``username``, or None (no user can have a U+0000 in its name:
    PostgreSQL text cannot hold one, so it is not even looked up)."""
    if "\x00" in username:
        return None
    return get_user_model().objects.filter(username=username).first()


def visible_changeset_ids(
    branches: Iterable[Branch], readable: Sequence[str] | None
) -> set[str] | None:
    """The fork, base and merge changesets of ``branches`` the caller can see (``None`` = all).

    The fork is whatever baseline changeset was newest when the branch was cut,
    often in a namespace the caller cannot read: its id must not show (not
    visible = not there). One query for a whole page of branches.
    """
    if readable is None:
        return None
    ids = {
        i
        for b in branches
        for i in (b.fork_changeset_id, b.base_changeset_id, b.merged_changeset_id)
        if i
    }
    if not ids or not readable:
        return set()
    rows = Changeset.objects.filter(pk__in=ids, namespaces__overlap=list(readable))
    return {str(i) for i in rows.values_list("id", flat=True)}


def branch_list(
    *, user: User, status: str | None = None, after: str | None = None, limit: int = 50
) -> list[Branch]:
    """One keyset page of visible branches in name order."""
    qs = visible_branches(user=user)
    if status is not None:
        qs = qs.filter(status=status)
    if after is not None:
        qs = qs.filter(name__gt=after)
    return list(qs[:limit])
