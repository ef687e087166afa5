"""entities.access: the one-statement role load gives the four-query answer."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
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
    # Guardian's checker counts an object grant only with the object model's own
    # permission (``permission__content_type`` is the object's content type).
    mine = {"content_type": ct, "permission__content_type": ct}
    rows = list(
        UserObjectPermission.objects.filter(user=user, **mine).values_list(
            "object_pk", "permission__codename"
        )
    ) + list(
        GroupObjectPermission.objects.filter(group__user=user, **mine).values_list(
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


def test_an_object_grant_counts_only_with_the_namespace_models_own_permission():
    # A row naming a namespace with a role-named permission of another model: guardian's
    # checker ignores it (it reads the object model's permissions only), so does Atlas.
    from guardian.core import ObjectPermissionChecker

    user = UserFactory()
    ns = NamespaceFactory()
    # (guardian's save() refuses such a row; a bulk insert, as a raw one, does not)
    UserObjectPermission.objects.bulk_create(
        [
            UserObjectPermission(
                user=user,
                permission=global_perm("write_namespace", model=Entity),
                content_type=ContentType.objects.get_for_model(Namespace),
                object_pk=ns.pk,
            )
        ]
    )
    assert not ObjectPermissionChecker(user).has_perm("write_namespace", ns)
    assert loaded(user) == reference_roles(user) == (Role.NONE, {})


def test_a_users_many_grants_load_as_the_reference_says():
    user = UserFactory()
    group = GroupFactory()
    user.groups.add(group)
    for i in range(60):
        ns = NamespaceFactory(name=f"many.{i:03d}")
        assign_perm(("read_namespace", "write_namespace", "maintain_namespace")[i % 3], user, ns)
        if i % 4 == 0:
            assign_perm("maintain_namespace", group, ns)
    floor, grants = loaded(user)
    assert (floor, grants) == reference_roles(user)
    assert len(grants) == 60


def _positional(sql: str, params: dict) -> tuple[str, list]:
    """``%(name)s`` placeholders as ``%s``, with the values in their order."""
    import re

    values: list = []

    def one(match: re.Match) -> str:
        values.append(params[match.group(1)])
        return "%s"

    return re.sub(r"%\((\w+)\)s", one, sql), values


def test_a_writes_role_rows_probe_its_namespaces_grants_not_every_grant():
    """The lock statement reads the writer's grants on the written namespace, one
    probe of guardian's unique index per role permission, under the generic plan
    that ``atlas.db.prepared_cursor`` runs: however many other namespaces she holds
    grants on, it reads none of them."""
    from entities.store.baseline import _lock_sql
    from tests.changesets.partition_helpers import analyze_generic
    from tests.changesets.test_time_seek import nodes

    user = UserFactory()
    for i in range(200):
        assign_perm("read_namespace", user, NamespaceFactory(name=f"many.{i:03d}"))
    # Other principals' grants, so that the table has the shape of a real one.
    ct = ContentType.objects.get_for_model(Namespace)
    read = Permission.objects.get(content_type=ct, codename="read_namespace")
    UserObjectPermission.objects.bulk_create(
        UserObjectPermission(user=other, permission=read, content_type=ct, object_pk=f"x.{i}")
        for other in UserFactory.create_batch(20)
        for i in range(1000)
    )
    target = NamespaceFactory(name="acme.target")
    assign_perm("write_namespace", user, target)
    fresh = type(user).objects.get(pk=user.pk)
    with connection.cursor() as cursor:  # as autovacuum would have (off on some test servers)
        cursor.execute("ANALYZE guardian_userobjectpermission, guardian_groupobjectpermission")
    params = access.guard_params(access.write_guard(fresh, branch="")) | {
        "ns": target.name,
        "kind": "k",
        "slug": "s",
    }
    plan = analyze_generic(*_positional(_lock_sql(False, 1), params))
    grants = [n for n in nodes(plan) if n.get("Relation Name") == "guardian_userobjectpermission"]
    assert grants, "the plan reads no user grants"
    # One probe per role permission (rows are per-loop averages, rounded down).
    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in grants)
    probes = sum(n["Actual Loops"] for n in grants)
    assert read <= 3 and probes <= 3, (read, probes, [n.get("Index Cond") for n in grants])
    assert all(
        "object_pk" in (n.get("Index Cond") or "") and n.get("Rows Removed by Filter", 0) <= 3
        for n in grants
    ), [(n.get("Index Name"), n.get("Index Cond"), n.get("Filter")) for n in grants]
