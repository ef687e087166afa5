"""How the changeset list narrows millions of rows: its filters, each a seek (issue 18).

- namespace: the readable names (a small table); filters on the namespaces'
  position indexes (``changesets.selectors.by_namespace``);
- rpc: the fixed choices (no query); a rare rpc is served by ``changeset_rare_rpc``;
- author and branch: for users who read everything, the column's distinct
  values by a loose index scan (one seek per value); for users limited to
  some namespaces, a typed box: listing only the values they may see would
  walk their newest thousands of changesets on every page (235-572 ms at a
  million), and listing all would name authors of changesets they cannot see;
  branch names come off ``changeset_branch_seq``, which holds branch changesets
  only (baseline is asked for apart); filtering by baseline reads the seq index
  backwards, by a branch seeks that index;
- until: a typed day, resolved to a seq bound by bisecting seq (``seq_upto``)
  (the date hierarchy is gone: its ``MIN(at)`` under a filter walked the ``at``
  index from the oldest end).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime, time
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from atlas.admin_keyset import AFTER, BEFORE
from atlas.admin_mixins import admin_roles, readable_namespace_choices
from changesets.admin.distinct import distinct_values
from changesets.models import BASELINE, Changeset
from changesets.selectors import by_namespace
from changesets.selectors.bounds import seq_upto

# Filter choices listed at most (the URL still filters by any value).
MAX_CHOICES = 100
BASELINE_CHOICE = "~baseline"  # never a branch name (those start with [a-z0-9])


class NamespaceFilter(admin.SimpleListFilter):
    """Namespaces the user can read; filters by the ``namespaces`` array's position
    indexes (:func:`~changesets.selectors.by_namespace.touching`)."""

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
        if getattr(request, "atlas_scoped_to", None) == value:
            return None  # the scope is this namespace already (ChangesetAdmin.get_queryset)
        return queryset.filter(by_namespace.touching([value]))


class TypedFilter(admin.SimpleListFilter):
    """A filter whose value is typed into a box (a GET form), not picked from a list.

    ``typed(request)`` says when; otherwise the choices of :meth:`lookups`. The
    form carries the changelist's other parameters, less the page position.
    """

    template = "atlas/admin/typed_filter.html"
    input_type = "text"
    placeholder = ""

    def typed(self, request: HttpRequest) -> bool:
        return True

    def __init__(self, request: HttpRequest, params: Any, model: Any, model_admin: Any) -> None:
        self.is_typed = self.typed(request)
        super().__init__(request, params, model, model_admin)

    def has_output(self) -> bool:
        return self.is_typed or super().has_output()

    def choices(self, changelist: ChangeList) -> Iterator[Any]:
        if not self.is_typed:
            yield from super().choices(changelist)
            return
        name = self.parameter_name or ""
        keep = {k: v for k, v in changelist.params.items() if k not in (name, BEFORE, AFTER)}
        yield {
            "typed": True,
            "name": name,
            "value": self.value() or "",
            "input_type": self.input_type,
            "placeholder": self.placeholder,
            "hidden": [
                (k, x) for k, v in keep.items() for x in (v if isinstance(v, list) else [v])
            ],
            "clear_url": changelist.get_query_string(remove=[name, BEFORE, AFTER]),
        }


class _DistinctFilter(TypedFilter):
    """Listed (a loose index scan) for users who read everything; typed for the others."""

    column = ""

    def typed(self, request: HttpRequest) -> bool:
        return admin_roles(request).readable() is not None

    def values(self) -> list[str]:
        rows = distinct_values("changesets_changeset", [self.column], limit=MAX_CHOICES)
        return [row[0] for row in rows]


class AuthorFilter(_DistinctFilter):
    title = "author"
    parameter_name = "author"
    column = "author_name"
    placeholder = "author name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [] if self.typed(request) else [(v, v) for v in self.values()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        return queryset.filter(author_name=self.value()) if self.value() else None


class BranchFilter(_DistinctFilter):
    title = "branch"
    parameter_name = "branch"
    column = "branch"
    placeholder = f"branch name, or {BASELINE_CHOICE}"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        if self.typed(request):
            return []
        return [(BASELINE_CHOICE, "baseline") if v == BASELINE else (v, v) for v in self.values()]

    def values(self) -> list[str]:
        # ``changeset_branch_seq`` holds branch changesets only (migration 0028), so
        # the loose scan says ``branch <> ''``, and baseline is asked for apart: the
        # newest baseline changeset, a step back along the seq index.
        newest = Changeset.objects.filter(branch=BASELINE).order_by("-seq").values("seq")
        base = [BASELINE] if newest[:1] else []
        rows = distinct_values(
            "changesets_changeset",
            [self.column],
            where="t.branch <> ''",
            limit=MAX_CHOICES - len(base),
        )
        return base + [row[0] for row in rows]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        # A named branch is a backward seek on ``changeset_branch_seq`` (branch
        # changesets only); baseline reads the seq index backwards and skips the few
        # branch rows: cheap while baseline is most of the log.
        value = self.value()
        if not value:
            return None
        return queryset.filter(branch=BASELINE if value == BASELINE_CHOICE else value)


class UntilFilter(TypedFilter):
    """Changesets up to the end of a day (the site's time zone), newest first.

    The day resolves to the last seq at or before its end by bisecting seq
    (``seq_upto``), so an old day costs what today costs.
    """

    title = "until day"
    parameter_name = "until"
    input_type = "date"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        value = self.value()
        if not value:
            return None
        try:
            day = date.fromisoformat(value)
        except ValueError:
            return queryset.none()
        end = datetime.combine(day, time.max, tzinfo=timezone.get_current_timezone())
        return queryset.filter(seq__lte=seq_upto(end))
