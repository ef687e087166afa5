"""Reads of branches: visibility, who may write them, lists, and the diff against baseline.

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.contrib.auth import models as auth_models
from django.db import connection
from django.db.models import Q, QuerySet

from branches.models import NAME_PATTERN, Branch, BranchMember
from changesets.models import Changeset
from changesets.selectors.feed import BASELINE_AFTER_COUNT
from entities import access
from entities.access import Role
from entities.store import EntityKey, StoredEntity, load_json

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


# --- the overlay against baseline -----------------------------------------------


@dataclass(frozen=True)
class OverlayChange:
    """One key where the branch's state differs from baseline's current state.

    ``op`` is what the branch did relative to the baseline it started from:
    ``create`` (baseline had no such entity when the branch first wrote it),
    ``update`` or ``delete``. ``conflict`` is true when baseline has moved
    since (its version is no longer ``base_version``) and does not already
    hold what the branch holds; merge refuses such keys.
    """

    key: EntityKey
    op: str
    deleted: bool
    base_version: int | None
    baseline_version: int | None
    conflict: bool
    changeset_id: UUID  # the branch changeset that last wrote the key
    content: dict[str, Any] | None = None  # the branch's content (merge plans only)


def _op(deleted: bool, base_version: int | None) -> str:
    if deleted:
        return "delete"
    return "create" if base_version is None else "update"


def _change(row: Sequence[Any], *, with_content: bool) -> OverlayChange:
    ns, kind, slug, deleted, base_version, baseline_version, changeset_id = row[:7]
    return OverlayChange(
        key=EntityKey(ns, kind, slug),
        op=_op(deleted, base_version),
        deleted=deleted,
        base_version=base_version,
        baseline_version=baseline_version,
        conflict=base_version != baseline_version,
        changeset_id=changeset_id,
        content=load_json(row[7]) if with_content and not deleted else None,
    )


# "The branch's state equals baseline's current state": both absent, or the
# same jsonb. jsonb's text form is canonical for a stored value (sorted keys,
# numbers as written), so text equality is exactly the write service's
# byte-identical comparison, without shipping content to Python.
_SAME = (
    "CASE WHEN o.deleted THEN {b}.slug IS NULL"
    " ELSE {b}.slug IS NOT NULL AND {b}.content::text = o.content::text END"
)


def _overlay_where(
    branch: Branch, namespaces: Sequence[str] | None, after: EntityKey | None = None
) -> tuple[str, list[Any]]:
    """The WHERE of the overlay-vs-baseline queries (overlay ``o``, baseline ``e``)."""
    where = f"o.branch_id = %s AND NOT ({_SAME.format(b='e')})"
    params: list[Any] = [branch.pk]
    if namespaces is not None:
        where += " AND o.namespace_id = ANY(%s::text[])"
        params.append(list(namespaces))
    if after is not None:
        where += " AND (o.namespace_id, o.kind, o.slug) > (%s, %s, %s)"
        params += [after.namespace, after.kind, after.slug]
    return where, params


_OVERLAY_JOIN = (
    " FROM branches_branchentity o"
    " LEFT JOIN entities_entity e ON e.namespace_id = o.namespace_id"
    "  AND e.kind = o.kind AND e.slug = o.slug"
)


def overlay_changes(
    *,
    branch: Branch,
    namespaces: Sequence[str] | None = None,
    with_content: bool = False,
    after: EntityKey | None = None,
    limit: int | None = None,
) -> list[OverlayChange]:
    """The branch's keys whose state differs from baseline's, in key order; one query.

    Keys the branch wrote but that now equal baseline (changed back, or baseline
    reached the same content independently) are left out: the result is
    exactly what a merge would land, plus the conflicts that would stop it.
    Cost grows with the branch's overlay, not with the store. ``after`` and
    ``limit`` cut one keyset page (the overlay's unique index is in key order).
    """
    where, params = _overlay_where(branch, namespaces, after)
    sql = (
        "SELECT o.namespace_id, o.kind, o.slug, o.deleted, o.base_version, e.version,"
        f" o.changeset_id{', o.content' if with_content else ''}"
        f"{_OVERLAY_JOIN} WHERE {where} ORDER BY o.namespace_id, o.kind, o.slug"
    )
    if limit is not None:
        sql += " LIMIT %s"
        params.append(limit)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [_change(row, with_content=with_content) for row in cursor.fetchall()]


def overlay_change_counts(*, branch: Branch) -> dict[str, int]:
    """How many keys a merge of ``branch`` would land (or find in conflict), per namespace.

    The same rows as :func:`overlay_changes`, counted without reading any
    content: a merge checks its permissions and op limit on these numbers
    before it loads the plan.
    """
    where, params = _overlay_where(branch, None)
    sql = f"SELECT o.namespace_id, count(*){_OVERLAY_JOIN} WHERE {where} GROUP BY o.namespace_id"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {ns: n for ns, n in cursor.fetchall()}


def overlay_changes_locked(
    *, branch: Branch
) -> tuple[list[OverlayChange], dict[EntityKey, StoredEntity]]:
    """Like :func:`overlay_changes`, after locking baseline's rows of every overlay key.

    For the merge, inside its write transaction (the branch row already
    locked): baseline rows are locked ``FOR UPDATE`` in key order, and the
    comparison uses the locked (latest) row versions, so what is judged is
    what the merge writes over. Returns the changes and, for each changed key
    that exists on baseline, its locked baseline entity.
    """
    sql = (
        "WITH b AS ("
        "  SELECT e.namespace_id, e.kind, e.slug, e.content, e.version, e.created_at,"
        "   e.updated_at, e.changeset_id"
        "  FROM entities_entity e JOIN branches_branchentity o2 ON o2.branch_id = %s"
        "   AND o2.namespace_id = e.namespace_id AND o2.kind = e.kind AND o2.slug = e.slug"
        "  ORDER BY e.namespace_id, e.kind, e.slug FOR UPDATE OF e)"
        " SELECT o.namespace_id, o.kind, o.slug, o.deleted, o.base_version, b.version,"
        "  o.changeset_id, b.content, b.created_at, b.updated_at, b.changeset_id"
        " FROM branches_branchentity o LEFT JOIN b ON b.namespace_id = o.namespace_id"
        "  AND b.kind = o.kind AND b.slug = o.slug"
        f" WHERE o.branch_id = %s AND NOT ({_SAME.format(b='b')})"
        " ORDER BY o.namespace_id, o.kind, o.slug"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [branch.pk, branch.pk])
        rows = cursor.fetchall()
    changes: list[OverlayChange] = []
    baseline: dict[EntityKey, StoredEntity] = {}
    for row in rows:
        change = _change(row, with_content=False)
        changes.append(change)
        if row[5] is not None:
            baseline[change.key] = StoredEntity(
                key=change.key,
                content=load_json(row[7]),
                version=row[5],
                created_at=row[8],
                updated_at=row[9],
                changeset_id=row[10],
            )
    return changes, baseline


@dataclass(frozen=True)
class Diff:
    behind: int
    ahead: int
    changes: list[OverlayChange]


def branch_diff(
    *,
    branch: Branch,
    namespaces: Sequence[str] | None,
    after: EntityKey | None = None,
    limit: int | None = None,
) -> Diff:
    """How far baseline moved since the base point, the branch's changesets, and its changes.

    The base point is the fork until a sync moves it (``Branch.base_seq``), so
    ``behind`` is 0 right after a sync.

    Two queries: the two counts, and :func:`overlay_changes`. ``ahead`` is a
    range of ``changeset_branch_seq`` (branch changesets only); ``behind``, for
    a caller who reads everything, counts index entries only
    (:data:`~changesets.selectors.feed.BASELINE_AFTER_COUNT`), else reads the
    changesets after the base point for their namespaces. Counts and changes
    are limited to changesets and keys in ``namespaces`` (the caller's readable
    set; ``None`` = all). ``changes`` is one keyset page: the keys after
    ``after``, at most ``limit`` of them (``None``: all); the counts are always
    whole.
    """
    ns_clause, ns_params = "", []
    if namespaces is None:
        behind_sql = BASELINE_AFTER_COUNT
        behind_params: list[Any] = [branch.base_seq, branch.base_seq]
    else:
        ns_clause = " AND c.namespaces && %s::varchar[]"
        ns_params = [list(namespaces)]
        behind_sql = (
            "(SELECT count(*) FROM changesets_changeset c WHERE c.branch = '' AND c.seq > %s"
            f"{ns_clause})"
        )
        behind_params = [branch.base_seq, *ns_params]
    sql = (
        f"SELECT {behind_sql},"
        f" (SELECT count(*) FROM changesets_changeset c WHERE c.branch = %s{ns_clause})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*behind_params, branch.name, *ns_params])
        behind, ahead = cursor.fetchone()
    changes = overlay_changes(branch=branch, namespaces=namespaces, after=after, limit=limit)
    return Diff(behind=behind, ahead=ahead, changes=changes)
