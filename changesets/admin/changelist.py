"""How the changeset list narrows millions of rows: its filters and date hierarchy.

Each is read by index seeks, never a scan or a full ``COUNT(*)``: the
date hierarchy by one ``min(at)`` seek per bucket, the filter choices by a
loose index scan (or, for users limited to some namespaces, from their
newest changesets). ``log`` wires them into the changeset admin.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta, tzinfo
from typing import Any, Literal

from django.contrib import admin
from django.db.models import Min, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from atlas.admin_mixins import admin_roles, loose_index_scan, readable_namespace_choices
from atlas.replicas import read_connection
from changesets.models import BASELINE

# Filter choices listed at most (the URL still filters by any value).
MAX_CHOICES = 100
# Restricted users' filter choices come from their newest this-many changesets.
RECENT = 10_000
BASELINE_CHOICE = "~baseline"  # never a branch name (those start with [a-z0-9])


class ChangesetQuerySet(QuerySet):
    """Changesets whose date hierarchy is read by index seeks.

    The admin's date hierarchy asks ``datetimes("at", "year")`` and the like:
    ``SELECT DISTINCT date_trunc(...)`` over every matching row. Here each
    distinct year, month or day costs one ``min(at)`` seek on the ``at`` index
    from the end of the previous one, under the same filters.
    """

    def datetimes(  # type: ignore[override]  # a list of datetimes, not a queryset
        self,
        field_name: str,
        kind: Literal["year", "month", "week", "day", "hour", "minute", "second"],
        order: Literal["ASC", "DESC"] = "ASC",
        tzinfo: tzinfo | None = None,
    ) -> Iterable[datetime]:
        if field_name != "at" or kind not in ("year", "month", "day"):
            return super().datetimes(field_name, kind, order=order, tzinfo=tzinfo)
        tz = tzinfo or timezone.get_current_timezone()
        qs = self.order_by()
        out: list[datetime] = []
        start: datetime | None = None
        while len(out) < 400:  # years, or the days of one month
            found = (qs if start is None else qs.filter(at__gte=start)).aggregate(m=Min("at"))["m"]
            if found is None:
                break
            local = found.astimezone(tz)
            day = 1 if kind != "day" else local.day
            month = 1 if kind == "year" else local.month
            bucket = datetime(local.year, month, day, tzinfo=tz)
            out.append(bucket)
            if kind == "year":
                start = datetime(bucket.year + 1, 1, 1, tzinfo=tz)
            elif kind == "month":
                start = datetime(
                    bucket.year + bucket.month // 12, bucket.month % 12 + 1, 1, tzinfo=tz
                )
            else:
                start = bucket + timedelta(days=1)
        return out if order == "ASC" else out[::-1]


# --- filters ------------------------------------------------------------------------


class NamespaceFilter(admin.SimpleListFilter):
    """Namespaces the user can read; filters on the GIN-indexed ``namespaces`` array."""

    title = "namespace"
    parameter_name = "namespace"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return readable_namespace_choices(request, limit=MAX_CHOICES)

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        value = self.value()
        if not value:
            return None
        if not admin_roles(request).can_read(value):
            return queryset.none()  # filtering by an unreadable namespace reveals nothing
        return queryset.filter(namespaces__contains=[value])


class _DistinctFilter(admin.SimpleListFilter):
    """Choices are the column's distinct values, read without scanning the table.

    Unrestricted users: a loose index scan (one seek per value). Users limited
    to some namespaces: the values among their newest :data:`RECENT` visible
    changesets (a loose scan filtered by namespace could walk most of the
    index when a value has no visible rows). The URL filters by any value.
    """

    column = ""

    def values(self, request: HttpRequest) -> list[str]:
        readable = admin_roles(request).readable()
        if readable is None:
            rows = loose_index_scan(
                table="changesets_changeset", columns=[self.column], limit=MAX_CHOICES
            )
            return [row[0] for row in rows]
        with read_connection().cursor() as cursor:
            cursor.execute(
                f"SELECT DISTINCT {self.column} FROM ("
                f" SELECT {self.column} FROM changesets_changeset"
                " WHERE namespaces && %s::varchar[] ORDER BY seq DESC LIMIT %s) recent"
                " ORDER BY 1 LIMIT %s",
                [readable, RECENT, MAX_CHOICES],
            )
            return [row[0] for row in cursor.fetchall()]


class AuthorFilter(_DistinctFilter):
    title = "author"
    parameter_name = "author"
    column = "author_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(v, v) for v in self.values(request)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        return queryset.filter(author_name=self.value()) if self.value() else None


class BranchFilter(_DistinctFilter):
    title = "branch"
    parameter_name = "branch"
    column = "branch"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (BASELINE_CHOICE, "baseline") if v == BASELINE else (v, v) for v in self.values(request)
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        value = self.value()
        if not value:
            return None
        return queryset.filter(branch=BASELINE if value == BASELINE_CHOICE else value)
