"""entities.access: the one-statement role load gives the four-query answer."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from guardian.models import GroupObjectPermission, UserObjectPermission
from guardian.shortcuts import assign_perm

from entities import access
from entities.access import _CODENAME_ROLE, Role
from entities.models import Entity, Namespace
from tests.entities.factories import GroupFactory, NamespaceFactory, UserFactory

pytestmark = pytest.mark.django_db


def reference_roles(user) -> tuple[Role, dict[str, Role]]:
    """The role table as computed before the one-statement load (four queries)."""
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
    return floor, grants


def loaded(user) -> tuple[Role, dict[str, Role]]:
    fresh = type(user).objects.get(pk=user.pk)  # no per-object caches
    roles = access._load_roles(fresh)
    return roles.floor, roles.grants


def global_perm(codename: str, model=Namespace) -> Permission:
    ct = ContentType.objects.get_for_model(model)
    return Permission.objects.get_or_create(
        codename=codename, content_type=ct, defaults={"name": codename}
    )[0]


def test_role_load_is_one_query(django_assert_num_queries):
    user = UserFactory()
    ns = NamespaceFactory()
    assign_perm("write_namespace", user, ns)
    fresh = type(user).objects.get(pk=user.pk)
    with django_assert_num_queries(1):
        access.roles_for(fresh)
        access.roles_for(fresh)  # cached on the user object


@pytest.mark.parametrize(
    ("direct", "via_group", "global_direct", "global_group"),
    list(itertools.product([None, "read_namespace", "maintain_namespace"], repeat=4)),
)
def test_role_load_matches_get_all_permissions_and_guardian(
    direct, via_group, global_direct, global_group
):
    user, other = UserFactory(), UserFactory()
    a, b = NamespaceFactory(name="acme.a"), NamespaceFactory(name="acme.b")
    group, other_group = GroupFactory(), GroupFactory()
    user.groups.add(group)
    other.groups.add(other_group)
    if direct:
        assign_perm(direct, user, a)
    if via_group:
        assign_perm(via_group, group, b)
        assign_perm(via_group, group, a)
    if global_direct:
        user.user_permissions.add(global_perm(global_direct))
    if global_group:
        group.permissions.add(global_perm(global_group))
    # Noise that must not count: other principals' grants, other groups.
    assign_perm("maintain_namespace", other, a)
    assign_perm("maintain_namespace", other_group, b)
    other.user_permissions.add(global_perm("maintain_namespace"))
    assert loaded(user) == reference_roles(user)


def test_role_load_ignores_permissions_of_other_apps_and_other_codenames():
    user = UserFactory()
    group = GroupFactory()
    user.groups.add(group)
    ns = NamespaceFactory()
    # A role-named codename on another app's content type is not "entities.<codename>".
    from django.contrib.auth.models import Group

    user.user_permissions.add(global_perm("write_namespace", model=Group))
    group.permissions.add(global_perm("maintain_namespace", model=Group))
    # A non-role permission of the entities app, globally and on the namespace.
    user.user_permissions.add(global_perm("view_entity", model=Entity))
    odd = global_perm("audit_namespace")
    user.user_permissions.add(odd)
    UserObjectPermission.objects.create(
        user=user,
        permission=odd,
        content_type=ContentType.objects.get_for_model(Namespace),
        object_pk=ns.pk,
    )
    assert loaded(user) == reference_roles(user) == (Role.NONE, {})


def test_role_load_of_a_global_entities_permission_on_another_model_counts():
    # get_all_permissions() names it "entities.write_namespace" all the same.
    user = UserFactory()
    user.user_permissions.add(global_perm("write_namespace", model=Entity))
    assert loaded(user) == reference_roles(user) == (Role.WRITER, {})


def test_inactive_staff_superuser_and_anonymous_roles():
    from django.contrib.auth.models import AnonymousUser

    inactive = UserFactory(is_active=False)
    assign_perm("maintain_namespace", inactive, NamespaceFactory())
    assert loaded(inactive) == (Role.NONE, {})
    assert loaded(UserFactory(is_staff=True)) == (Role.NONE, {})  # is_staff opens the admin only
    assert loaded(UserFactory(is_superuser=True)) == (Role.MAINTAINER, {})
    anonymous = access._load_roles(AnonymousUser())
    assert (anonymous.floor, anonymous.grants) == (Role.NONE, {})
