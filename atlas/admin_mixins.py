"""Admin building blocks shared by the apps.

- :class:`ReadOnlyAdmin`: browse only, for the log and the entity table.
- :func:`admin_roles`: the namespace roles the admin applies to a user (see
  ``docs/admin.md``, "Who sees what"): superusers are maintainers everywhere;
  every other admin user has exactly the roles their grants give them.
- :class:`NamespaceScopedAdmin`: a read-only admin whose rows are limited to
  the namespaces the user can read (DESIGN invariant 8).
- :class:`EstimatedCountPaginator`: page counts without a full ``COUNT(*)``.
- :func:`loose_index_scan`: the distinct values of an index prefix in one
  index seek per value (PostgreSQL 16 has no skip scan of its own).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.contrib import admin
from django.contrib.contenttypes.models import ContentType
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import QuerySet
from django.http import HttpRequest
from guardian.models import GroupObjectPermission, UserObjectPermission

from entities.access import ROLE_PERMISSIONS, Role, required_write_role
from entities.models import Namespace

# A permission codename -> the lowest role that holds it (read -> reader, ...).
_CODENAME_ROLE: dict[str, Role] = {}
for _role in sorted(ROLE_PERMISSIONS):
    for _codename in ROLE_PERMISSIONS[_role]:
        _CODENAME_ROLE.setdefault(_codename, _role)

_REQUEST_ATTR = "_atlas_admin_roles"


@dataclass
class AdminRoles:
    """One admin user's namespace roles: a floor for every namespace, plus grants."""

    floor: Role = Role.NONE
    grants: dict[str, Role] = field(default_factory=dict)

    def role(self, namespace: str) -> Role:
        return max(self.floor, self.grants.get(namespace, Role.NONE))

    def can_read(self, namespace: str) -> bool:
        return self.role(namespace) >= Role.READER

    def readable(self) -> list[str] | None:
        """Names the user may read, or ``None`` meaning every namespace."""
        if self.floor >= Role.READER:
            return None
        return sorted(ns for ns, role in self.grants.items() if role >= Role.READER)

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


def _load_admin_roles(user: Any) -> AdminRoles:
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return AdminRoles()
    if user.is_superuser:
        return AdminRoles(floor=Role.MAINTAINER)
    # Unlike entities.access (the API), ``is_staff`` adds nothing here: it is
    # Django's "may log in to the admin" flag, not a namespace role.
    floor = Role.NONE
    for perm in user.get_all_permissions():
        app, _, codename = perm.partition(".")
        if app == "entities" and codename in _CODENAME_ROLE:
            floor = max(floor, _CODENAME_ROLE[codename])
    ct = ContentType.objects.get_for_model(Namespace)
    rows = list(
        UserObjectPermission.objects.filter(user=user, content_type=ct).values_list(
            "object_pk", "permission__codename"
        )
    ) + list(
        GroupObjectPermission.objects.filter(group__user=user, content_type=ct).values_list(
            "object_pk", "permission__codename"
        )
    )
    grants: dict[str, Role] = {}
    for object_pk, codename in rows:
        role = _CODENAME_ROLE.get(codename, Role.NONE)
        if role > grants.get(object_pk, Role.NONE):
            grants[object_pk] = role
    return AdminRoles(floor=floor, grants=grants)


def admin_roles(request: HttpRequest) -> AdminRoles:
    """The roles the admin applies to ``request.user``, loaded once per request."""
    roles = getattr(request, _REQUEST_ATTR, None)
    if roles is None:
        roles = _load_admin_roles(request.user)
        setattr(request, _REQUEST_ATTR, roles)
    return roles


class ReadOnlyAdmin(admin.ModelAdmin):
    """Browse only: no add, change or delete for anyone, superusers included.

    Used for the log (invariant 7) and for entities, which only the write
    service may change (invariant 1).
    """

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}


class NamespaceScopedAdmin(ReadOnlyAdmin):
    """Read-only, and only rows in namespaces the user can read (invariant 8).

    Subclasses say how a row names its namespace: ``namespace_field`` for a
    single namespace column, or ``namespaces_array_field`` for an array of
    them (a changeset is visible when any of its namespaces is readable).
    """

    namespace_field: str | None = None
    namespaces_array_field: str | None = None

    def scope(self, qs: QuerySet, readable: list[str]) -> QuerySet:
        if self.namespaces_array_field:
            return qs.filter(**{f"{self.namespaces_array_field}__overlap": readable})
        assert self.namespace_field, "set namespace_field or namespaces_array_field"
        return qs.filter(**{f"{self.namespace_field}__in": readable})

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        readable = admin_roles(request).readable()
        return qs if readable is None else self.scope(qs, readable)


# --- counting without COUNT(*) -----------------------------------------------------


def estimated_rows(qs: QuerySet) -> int:
    """PostgreSQL's own estimate of ``qs``'s row count, read without scanning.

    Unfiltered: the table's ``reltuples`` (kept by VACUUM/ANALYZE). Filtered:
    the row estimate of the query plan (``EXPLAIN``), which is what the
    planner itself believes.
    """
    if not qs.query.where:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                [qs.model._meta.db_table],
            )
            row = cursor.fetchone()
        if row and row[0] >= 0:  # -1: never analyzed
            return int(row[0])
    plan = json.loads(qs.order_by().explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    """Counts exactly up to ``exact_up_to`` rows, and estimates beyond.

    The exact part is ``SELECT count(*) FROM (… LIMIT exact_up_to + 1)``, so it
    reads at most that many rows whatever the table's size; past it the count
    is PostgreSQL's estimate and ``estimated`` is set (the pagination template
    says "about").
    """

    exact_up_to = 10_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.estimated = False

    @cached_property
    def count(self) -> int:  # type: ignore[override]
        qs = self.object_list
        capped = qs.order_by()[: self.exact_up_to + 1].count()
        if capped <= self.exact_up_to:
            return capped
        self.estimated = True
        return max(capped, estimated_rows(qs))


def loose_index_scan(
    *,
    table: str,
    columns: Sequence[str],
    where: str = "TRUE",
    params: Sequence[Any] = (),
    limit: int | None = None,
) -> list[tuple[Any, ...]]:
    """The distinct values of ``columns`` (a leading prefix of a b-tree index on ``table``).

    A recursive CTE seeks the next distinct tuple with ``(cols) > (previous)
    ORDER BY cols LIMIT 1``: one index seek per distinct value, never a scan
    of the rows between. ``where`` (with ``params``) is applied to every seek
    and must refer to columns as ``t.<column>``. With ``limit``, the walk stops
    after that many values (PostgreSQL evaluates a recursive CTE lazily).
    """
    cols = ", ".join(f"t.{c}" for c in columns)
    prev = ", ".join(f"d.{c}" for c in columns)
    names = ", ".join(columns)
    sql = (
        f"WITH RECURSIVE d({names}) AS ("
        f" (SELECT {cols} FROM {table} t WHERE {where} ORDER BY {cols} LIMIT 1)"
        f" UNION ALL"
        f" SELECT n.* FROM d CROSS JOIN LATERAL ("
        f"  SELECT {cols} FROM {table} t WHERE ({cols}) > ({prev}) AND {where}"
        f"  ORDER BY {cols} LIMIT 1) n"
        f") SELECT {names} FROM d"
    )
    args = [*params, *params]
    if limit is not None:
        sql += " LIMIT %s"
        args.append(limit)
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
        return [tuple(row) for row in cursor.fetchall()]


def pretty_json(value: Any) -> str:
    """JSON as people read it: indented, keys sorted, non-ASCII kept."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
