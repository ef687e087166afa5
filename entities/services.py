"""Writes to namespaces and role grants (staff operations).

Granting is a write, so it lives here, one transaction each. A grant
replaces whatever role the principal had in that namespace.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.db import IntegrityError, transaction
from guardian.core import ObjectPermissionChecker
from guardian.shortcuts import assign_perm, remove_perm

from atlas.exceptions import Conflict, NotFound, ValidationFailed
from entities import access
from entities.access import ROLE_PERMISSIONS, Role
from entities.models import Namespace
from entities.validation import MSG_NAMESPACE, is_valid_namespace

ALL_PERMISSIONS = ROLE_PERMISSIONS[Role.MAINTAINER]
ROLE_NAMES = {"reader": Role.READER, "writer": Role.WRITER, "maintainer": Role.MAINTAINER}


@transaction.atomic
def namespace_create(*, name: str, protected: bool = False) -> Namespace:
    """Create a namespace; entities can be written in it only after this."""
    if not is_valid_namespace(name):
        raise ValidationFailed(
            MSG_NAMESPACE, errors=[{"pointer": "/name", "detail": MSG_NAMESPACE}]
        )
    try:
        with transaction.atomic():
            return Namespace.objects.create(name=name, protected=protected)
    except IntegrityError as exc:
        raise Conflict(f"Namespace {name!r} already exists.", pointer="/name") from exc


@transaction.atomic
def namespace_update(*, name: str, protected: bool) -> Namespace:
    namespace = Namespace.objects.select_for_update().filter(name=name).first()
    if namespace is None:
        raise NotFound(f"Namespace {name!r} not found.")
    if namespace.protected != protected:
        namespace.protected = protected
        namespace.save(update_fields=["protected"])
    return namespace


@transaction.atomic
def role_grant(*, namespace: Namespace, principal: User | Group, role: str) -> bool:
    """Give ``principal`` exactly ``role`` in ``namespace`` (replacing any other role).

    Returns True when the principal held no role there before (a new grant).
    """
    level = ROLE_NAMES.get(role)
    if level is None:
        raise ValidationFailed(
            "role must be reader, writer or maintainer.",
            errors=[{"pointer": "/role", "detail": "One of reader, writer, maintainer."}],
        )
    wanted = set(ROLE_PERMISSIONS[level])
    checker = ObjectPermissionChecker(principal)
    had_role = bool(set(checker.get_perms(namespace)) & set(ALL_PERMISSIONS))
    for codename in ALL_PERMISSIONS:
        if codename in wanted:
            assign_perm(codename, principal, namespace)
        else:
            remove_perm(codename, principal, namespace)
    if isinstance(principal, User):
        access.forget_roles(principal)
    return not had_role


@transaction.atomic
def role_revoke(*, namespace: Namespace, principal: User | Group) -> None:
    for codename in ALL_PERMISSIONS:
        remove_perm(codename, principal, namespace)
    if isinstance(principal, User):
        access.forget_roles(principal)
