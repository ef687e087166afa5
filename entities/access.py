"""Who may do what in which namespace: roles over django-guardian permissions.

A role grant stores every permission up to its level, so "can read" is one
permission check however the user got it (directly, through a group, or as a
global Django permission). Staff users are maintainers everywhere.

Roles are computed once per user object and cached on it: a request checks
many namespaces, and a batch must not cost a query per op.
"""

from __future__ import annotations

import contextlib
from enum import IntEnum

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.contrib.contenttypes.models import ContentType
from guardian.models import GroupObjectPermission, UserObjectPermission

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
_CACHE_ATTR = "_atlas_namespace_roles"

User = AbstractBaseUser | AnonymousUser


def is_staff(user: User) -> bool:
    return bool(getattr(user, "is_authenticated", False) and (user.is_staff or user.is_superuser))


class _Roles:
    """Per-user role table: explicit grants, plus a floor from global permissions."""

    def __init__(self, floor: Role, grants: dict[str, Role]) -> None:
        self.floor = floor
        self.grants = grants

    def role(self, namespace: str) -> Role:
        return max(self.floor, self.grants.get(namespace, Role.NONE))


def _load_roles(user: User) -> _Roles:
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return _Roles(Role.NONE, {})
    if is_staff(user):
        return _Roles(Role.MAINTAINER, {})
    floor = Role.NONE
    for perm in user.get_all_permissions():
        app, _, codename = perm.partition(".")
        if app == "entities" and codename in _CODENAME_ROLE:
            floor = max(floor, _CODENAME_ROLE[codename])
    ct = ContentType.objects.get_for_model(Namespace)
    grants: dict[str, Role] = {}
    rows = list(
        UserObjectPermission.objects.filter(user=user, content_type=ct).values_list(
            "object_pk", "permission__codename"
        )
    ) + list(
        GroupObjectPermission.objects.filter(group__user=user, content_type=ct).values_list(
            "object_pk", "permission__codename"
        )
    )
    for object_pk, codename in rows:
        role = _CODENAME_ROLE.get(codename, Role.NONE)
        if role > grants.get(object_pk, Role.NONE):
            grants[object_pk] = role
    return _Roles(floor, grants)


def roles_for(user: User) -> _Roles:
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
    """Names the user may read, or ``None`` meaning "all of them" (staff, global perms)."""
    roles = roles_for(user)
    if roles.floor >= Role.READER:
        return None
    return sorted(ns for ns, role in roles.grants.items() if role >= Role.READER)


def required_write_role(namespace: Namespace, *, branch: str) -> Role:
    """Protected namespaces need a maintainer for baseline writes; branches need a writer."""
    return Role.MAINTAINER if namespace.protected and branch == "" else Role.WRITER


def require_write(
    user: User,
    namespaces: dict[str, Namespace],
    *,
    branch: str,
    pointers: dict[str, str | None] | None = None,
) -> None:
    """Raise unless ``user`` may write every namespace in ``namespaces``.

    Unreadable namespaces answer 404 (not visible = not found); readable but
    not writable ones 403, with the pointer of the first op that touched it.
    """
    pointers = pointers or {}
    for name, namespace in namespaces.items():
        role = role_in(user, name)
        needed = required_write_role(namespace, branch=branch)
        if role < Role.READER:
            raise NotFound(f"Namespace {name!r} not found.", pointer=pointers.get(name))
        if role < needed:
            raise PermissionDenied(
                f"Writing {name!r}{' baseline' if needed == Role.MAINTAINER else ''} "
                f"needs the {needed.name.lower()} role.",
                pointer=pointers.get(name),
            )
