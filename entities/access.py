"""Who may do what in which namespace: roles over django-guardian permissions.

A role grant stores every permission up to its level, so "can read" is one
permission check however the user got it (directly, through a group, or as a
global Django permission).

This is the one role engine: the API, the admin, the feed, exports and every
service ask it, so no surface can answer differently from another (the
admin once had its own, and a scoped admin account could read through the
API what the admin hid from it). The rule is short: a superuser holds every
role everywhere; anyone else, staff included, holds exactly what their
grants give them. ``is_staff`` is Django's "may log in to the admin" flag
and opens no namespace (docs/security.md).

Roles are computed once per user object (one statement) and cached on it: a
request checks many namespaces, and a batch must not cost a query per op. The
cache lives no longer than the user object, i.e. one request, so a grant,
group or ``is_superuser`` change is seen by the next request without
invalidation. A write whose actor's roles are not loaded yet does not load
them first: its :class:`WriteGuard` is *pending*, and the store's lock
statement reads the same role rows, on the keys' namespaces (:func:`guard_ctes`),
locks only where they allow, and hands them back for the 404/403 decision
(:meth:`WriteGuard.learn`), so an authorized single write is BEGIN, lock, log,
COMMIT (issue 17).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from django.contrib.auth import models as auth_models
from django.contrib.auth.models import AnonymousUser
from django.contrib.contenttypes.models import ContentType
from guardian.models import GroupObjectPermission, UserObjectPermission

from atlas.db import prepared_cursor
from atlas.exceptions import NotFound, PermissionDenied
from entities.models import Namespace


class Role(IntEnum):
    NONE = 0
    READER = 1
    WRITER = 2
    MAINTAINER = 3


ROLE_PERMISSIONS: dict[Role, list[str]] = {
    Role.READER: ["read_namespace"],
    Role.WRITER: ["read_namespace", "write_namespace"],
    Role.MAINTAINER: ["read_namespace", "write_namespace", "maintain_namespace"],
}
_CODENAME_ROLE = {
    "read_namespace": Role.READER,
    "write_namespace": Role.WRITER,
    "maintain_namespace": Role.MAINTAINER,
}
_CODENAMES = list(_CODENAME_ROLE)
_CACHE_ATTR = "_atlas_namespace_roles"

# The project runs on Django's own user model (no AUTH_USER_MODEL), so the
# signed-in principal is ``auth.User``; DRF hands views an ``AnonymousUser`` otherwise.
User = auth_models.User | AnonymousUser


def is_superuser(user: User) -> bool:
    """The one principal above the grants: every role in every namespace."""
    return bool(getattr(user, "is_authenticated", False) and user.is_active and user.is_superuser)


class Roles:
    """Per-user role table: explicit grants, plus a floor from global permissions."""

    def __init__(self, floor: Role, grants: dict[str, Role]) -> None:
        self.floor = floor
        self.grants = grants

    def role(self, namespace: str) -> Role:
        return max(self.floor, self.grants.get(namespace, Role.NONE))

    def can_read(self, namespace: str) -> bool:
        return self.role(namespace) >= Role.READER

    def at_least(self, level: Role) -> tuple[str, ...] | None:
        """Names where the user holds ``level`` or more; ``None`` means every namespace."""
        if self.floor >= level:
            return None
        return tuple(sorted(ns for ns, role in self.grants.items() if role >= level))

    def readable(self) -> list[str] | None:
        """Names the user may read, or ``None`` meaning every namespace."""
        names = self.at_least(Role.READER)
        return None if names is None else list(names)

    def can_write_all(self, names: Sequence[str], *, branch: str = "") -> bool:
        """May write every namespace in ``names`` (maintainer for a protected baseline).

        A namespace that no longer exists cannot be written, so it refuses.
        """
        namespaces = {ns.name: ns for ns in Namespace.objects.filter(name__in=list(names))}
        return bool(names) and all(
            name in namespaces
            and self.role(name) >= required_write_role(namespaces[name], branch=branch)
            for name in names
        )


@functools.cache
def _roles_sql(scope: str = "") -> str:
    """One statement for every row that can give a user a role (built once, lazily).

    The same answer as ``user.get_all_permissions()`` (Django's ModelBackend:
    the user's and their groups' global permissions; guardian's backend adds
    none without an object) filtered to the ``entities`` app, plus the user's
    and their groups' guardian permissions on namespaces: four ``UNION ALL``
    arms, ``object_pk`` NULL for the global ones. One round trip instead of
    four. ``scope``, a query of namespace names, keeps only the grants on those
    (the global rows always count), so a write reads its own namespaces' rows,
    however many grants the user holds elsewhere.

    The three role permissions are read once (``pm``) and every arm joins
    their ids: each arm used to join ``auth_permission`` and
    ``django_content_type`` for every grant row, which doubled a role load's
    and a lock statement's server time for a user with 500 grants while the
    tables had no statistics (``bench/roles.py``, docs/benchmarks.md "Role
    rows"). An object grant counts with the namespace model's own permission
    only, as guardian's checker reads it.
    """
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    user_model = get_user_model()
    user_perms = user_model.user_permissions.through._meta.db_table
    user_groups = user_model.groups.through._meta.db_table
    group_perms = Group.permissions.through._meta.db_table
    perm = Permission._meta.db_table
    ct = ContentType._meta.db_table
    # Global permissions count by their content type's app label, as
    # "entities.<codename>" does in get_all_permissions().
    pm = (
        "pm(id, codename, ct) AS MATERIALIZED (SELECT p.id, p.codename,"
        " CASE WHEN c.model = 'namespace' THEN c.id END"
        f" FROM {ct} c JOIN {perm} p ON p.content_type_id = c.id"
        " WHERE c.app_label = 'entities' AND p.codename = ANY(%(codenames)s))"
    )
    user_object, group_object = _object_arms(scope, user_groups)
    return (
        f"WITH {pm}"
        f" SELECT NULL, pm.codename FROM {user_perms} x JOIN pm ON pm.id = x.permission_id"
        " WHERE x.user_id = %(user)s"
        " UNION ALL"
        f" SELECT NULL, pm.codename FROM {user_groups} g"
        f" JOIN {group_perms} x ON x.group_id = g.group_id JOIN pm ON pm.id = x.permission_id"
        " WHERE g.user_id = %(user)s"
        f" UNION ALL{user_object}"
        f" UNION ALL{group_object}"
    )


def _object_arms(scope: str, user_groups: str) -> tuple[str, str]:
    """:func:`_roles_sql`'s arms of the user's and her groups' guardian grants.

    Scoped, each (namespace, permission) pair is one probe of guardian's index of
    (principal, content type, object), not a scan of every grant the principal
    holds: ``OFFSET 0`` keeps the LATERAL subquery from being pulled up into a
    join that the generic plan drove from the principal's grants.
    """
    uop = UserObjectPermission._meta.db_table
    gop = GroupObjectPermission._meta.db_table
    if not scope:
        on_pm = " JOIN pm ON pm.id = x.permission_id AND pm.ct = x.content_type_id"
        return (
            f" SELECT x.object_pk, pm.codename FROM {uop} x{on_pm} WHERE x.user_id = %(user)s",
            f" SELECT x.object_pk, pm.codename FROM {user_groups} g"
            f" JOIN {gop} x ON x.group_id = g.group_id{on_pm} WHERE g.user_id = %(user)s",
        )

    def probe(table: str, principal: str, groups: str = "", where: str = "") -> str:
        return (
            f" SELECT x.object_pk, pm.codename FROM {groups}({scope}) s(name) CROSS JOIN pm"
            f" CROSS JOIN LATERAL (SELECT x.object_pk FROM {table} x WHERE {principal}"
            " AND x.permission_id = pm.id AND x.object_pk = s.name"
            f" AND x.content_type_id = pm.ct OFFSET 0) x{where}"
        )

    return (
        probe(uop, "x.user_id = %(user)s"),
        probe(
            gop,
            "x.group_id = g.group_id",
            f"{user_groups} g CROSS JOIN ",
            " WHERE g.user_id = %(user)s",
        ),
    )


def _without_grants(user: User) -> Roles | None:
    """The roles that need no grant rows: none (anonymous, inactive), all (superuser)."""
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return Roles(Role.NONE, {})
    if user.is_superuser:
        return Roles(Role.MAINTAINER, {})
    return None


def _load_roles(user: User) -> Roles:
    known = _without_grants(user)
    if known is not None:
        return known
    with prepared_cursor() as cursor:  # every request runs it: parse and plan once
        cursor.execute(_roles_sql(), {"user": user.pk, "codenames": list(_CODENAME_ROLE)})
        rows = cursor.fetchall()
    return _fold(rows)


def _fold(rows: Sequence[Sequence[str | None]]) -> Roles:
    """The role table of ``(object_pk, codename)`` rows of :func:`_roles_sql`."""
    floor = Role.NONE
    grants: dict[str, Role] = {}
    for object_pk, codename in rows:
        role = _CODENAME_ROLE[str(codename)]
        if object_pk is None:
            floor = max(floor, role)
        elif role > grants.get(object_pk, Role.NONE):
            grants[object_pk] = role
    return Roles(floor, grants)


def roles_for(user: User) -> Roles:
    cached = getattr(user, _CACHE_ATTR, None)
    if cached is None:
        cached = _load_roles(user)
        with contextlib.suppress(AttributeError):
            setattr(user, _CACHE_ATTR, cached)
    return cached


def forget_roles(user: User) -> None:
    """Drop the cached role table (after a grant changes it)."""
    if hasattr(user, _CACHE_ATTR):
        delattr(user, _CACHE_ATTR)


def role_in(user: User, namespace: str) -> Role:
    return roles_for(user).role(namespace)


def can_read(user: User, namespace: str) -> bool:
    return role_in(user, namespace) >= Role.READER


def readable_namespaces(user: User) -> list[str] | None:
    """Names the user may read, or ``None`` meaning "all of them" (superusers, global perms)."""
    return roles_for(user).readable()


@dataclass(frozen=True)
class WriteGuard:
    """The namespaces a user may write, for the write service's row locks.

    Stores lock rows only in namespaces the guard allows, so a caller without
    the role never holds a lock. ``None`` means every namespace.

    A *pending* guard (``pending`` is the user) is for an actor whose roles are
    not loaded yet: its name lists are empty, and a store that embeds
    :func:`guard_ctes` in its lock statement decides from the user's role rows
    read by that same statement (those on the keys' namespaces), then hands
    them to :meth:`learn`. A store that asks :meth:`allows` instead loads the
    user's whole role table with :func:`roles_for`.
    """

    unprotected: tuple[str, ...] | None
    protected: tuple[str, ...] | None
    pending: User | None = None
    branch: str = ""
    # The roles a lock statement read for ``pending``, on its keys' namespaces only.
    learned: list[Roles] = field(default_factory=list, compare=False, hash=False)

    def allows(self, name: str, protected: bool) -> bool:
        if self.pending is not None:
            needed = Role.MAINTAINER if protected and self.branch == "" else Role.WRITER
            return (self.learned_roles() or roles_for(self.pending)).role(name) >= needed
        names = self.protected if protected else self.unprotected
        return names is None or name in names

    def learn(self, rows: Sequence[Sequence[str | None]]) -> None:
        """Keep the pending user's roles from the lock statement's ``ur`` rows, so
        the 404/403 decision after the lock (:func:`require_write`) reads no more.

        Not cached on the user: they cover the keys' namespaces, not every one.
        """
        if self.pending is not None:
            self.learned[:] = [_fold(rows)]

    def learned_roles(self) -> Roles | None:
        """The pending user's roles a lock statement read (its keys' namespaces only)."""
        return self.learned[0] if self.learned else None


def write_guard(user: User, *, branch: str) -> WriteGuard:
    """:class:`WriteGuard` for ``user`` writing ``branch`` (the rule of
    :func:`required_write_role`, over every namespace at once); pending when
    reading the user's grants would cost a statement of its own."""
    roles = getattr(user, _CACHE_ATTR, None) or _without_grants(user)
    if roles is None:
        return WriteGuard((), (), pending=user, branch=branch)
    writer = roles.at_least(Role.WRITER)
    maintainer = writer if branch != "" else roles.at_least(Role.MAINTAINER)
    return WriteGuard(writer, maintainer, branch=branch)


@functools.cache
def guard_ctes() -> str:
    """Two CTEs for a store's lock statement, after one ``n(name, protected)`` of
    the keys' namespaces: ``ur(object_pk, codename)``, the pending user's role
    rows on those namespaces (:func:`_roles_sql`; none unless pending), and
    ``wa(name)``, the names in ``n`` the guard lets the user write.

    ``wa`` is :func:`required_write_role` over the role table :func:`_fold`
    builds from the same rows (the floor from global permissions, the best
    grant per namespace), so the lock and the 404/403 decision after it cannot
    disagree. Parameters: :func:`guard_params`.
    """
    level = " ".join(f"WHEN '{c}' THEN {int(r)}" for c, r in _CODENAME_ROLE.items())
    listed = (
        "CASE WHEN n.protected"
        " THEN jsonb_typeof(%(guard)s::jsonb->'p') = 'null' OR %(guard)s::jsonb->'p' ? n.name"
        " ELSE jsonb_typeof(%(guard)s::jsonb->'u') = 'null' OR %(guard)s::jsonb->'u' ? n.name END"
    )
    return (
        f"ur(object_pk, codename) AS ({_roles_sql('SELECT name FROM n')}),"
        f" wa AS (SELECT n.name FROM n WHERE {listed}"
        f" OR (SELECT max(CASE ur.codename {level} END) FROM ur"
        "  WHERE ur.object_pk IS NULL OR ur.object_pk = n.name)"
        f" >= CASE WHEN n.protected AND %(baseline)s THEN {int(Role.MAINTAINER)}"
        f" ELSE {int(Role.WRITER)} END)"
    )


def guard_params(guard: WriteGuard | None) -> dict[str, Any]:
    """:func:`guard_ctes`' parameters; ``None`` lets every namespace be written.

    The name lists go as one JSON document (one ``json.dumps`` in C), not as
    arrays: psycopg adapts every array parameter in Python.
    """
    if guard is None:
        lists: dict[str, list[str] | None] = {"p": None, "u": None}
    else:
        lists = {
            "p": None if guard.protected is None else list(guard.protected),
            "u": None if guard.unprotected is None else list(guard.unprotected),
        }
    pending = guard.pending if guard is not None else None
    return {
        "guard": json.dumps(lists),
        "user": pending.pk if pending is not None else None,
        "codenames": _CODENAMES,
        "baseline": guard is None or guard.branch == "",
    }


def required_write_role(namespace: Namespace, *, branch: str) -> Role:
    """Protected namespaces need a maintainer for baseline writes; branches need a writer."""
    return Role.MAINTAINER if namespace.protected and branch == "" else Role.WRITER


def require_write(
    user: User,
    namespaces: dict[str, Namespace],
    *,
    branch: str,
    pointers: dict[str, str | None] | None = None,
    roles: Roles | None = None,
) -> None:
    """Raise unless ``user`` may write every namespace in ``namespaces``.

    ``roles``: the user's roles in these namespaces when already read (a pending
    guard's, :meth:`WriteGuard.learned_roles`); else :func:`roles_for`.

    Unreadable namespaces answer 404 (not visible = not found); readable but
    not writable ones 403, with the pointer of the first op that touched it.
    """
    pointers = pointers or {}
    for name, namespace in namespaces.items():
        role = (roles or roles_for(user)).role(name)
        needed = required_write_role(namespace, branch=branch)
        if role < Role.READER:
            raise NotFound(f"Namespace {name!r} not found.", pointer=pointers.get(name))
        if role < needed:
            raise PermissionDenied(
                f"Writing {name!r}{' baseline' if needed == Role.MAINTAINER else ''} "
                f"needs the {needed.name.lower()} role.",
                pointer=pointers.get(name),
            )
