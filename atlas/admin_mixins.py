"""Admin building blocks shared by the apps.

- :class:`ReadOnlyAdmin`: browse only, for the log and the entity table.
- :func:`admin_user`: ``request.user`` as the signed-in user it always is here.
- :func:`admin_roles`: the namespace roles the admin applies to a user: the
  same engine as the API (``entities.access``; ``docs/admin.md``, "Who sees
  what"): superusers are maintainers everywhere; every other admin user has
  exactly the roles their grants give them.
- :class:`NamespaceScopedAdmin`: a read-only admin whose rows are limited to
  the namespaces the user can read (DESIGN invariant 8).
- :class:`EstimatedCountPaginator`: page counts without a full ``COUNT(*)``.
- :func:`loose_index_scan`: the distinct values of an index prefix in one
  index seek per value (PostgreSQL 16 has no skip scan of its own).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from typing import Any, cast

from django.contrib import admin
from django.contrib.auth.models import User
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest

from atlas.replicas import read_connection
from entities.access import Roles, roles_for
from entities.models import Namespace


def admin_user(request: HttpRequest) -> User:
    """``request.user``, typed as the user it is on every admin page.

    The admin site sends anonymous requests to its login page before any
    ModelAdmin method runs, so services that take an ``actor`` can be handed it.
    """
    return cast(User, request.user)


def admin_roles(request: HttpRequest) -> Roles:
    """The roles the admin applies to ``request.user``: the API's, from the one engine.

    :func:`entities.access.roles_for` caches them on the user object, which
    lives for one request, so every check on an admin page costs one query.
    """
    return roles_for(request.user)


def readable_namespace_choices(request: HttpRequest, *, limit: int) -> list[tuple[str, str]]:
    """A namespace list filter's choices: the names the user can read, in name order."""
    readable = admin_roles(request).readable()
    names = Namespace.objects.values_list("name", flat=True).order_by("name")
    if readable is not None:
        names = names.filter(name__in=readable)
    return [(n, n) for n in names[:limit]]


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
        with connections[qs.db].cursor() as cursor:
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
    def count(self) -> int:
        qs = cast("QuerySet[Any]", self.object_list)  # the admin paginates querysets
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
    with read_connection().cursor() as cursor:
        cursor.execute(sql, args)
        return [tuple(row) for row in cursor.fetchall()]


def pretty_json(value: Any) -> str:
    """JSON as people read it: indented, keys sorted, non-ASCII kept."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
