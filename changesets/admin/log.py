"""The log in the admin: changesets, revisions and journal entries, read-only.

Built for millions of rows: ordering by ``-seq`` (unique index), no full
``COUNT(*)`` (:class:`~atlas.admin_mixins.EstimatedCountPaginator`,
``show_full_result_count = False``), filter choices and the date hierarchy
read by index seeks (``changelist.py``), and search by exact entity or id (``search.py``).
Rows are limited to the namespaces the user can read (``docs/admin.md``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from atlas.admin_mixins import (
    EstimatedCountPaginator,
    NamespaceScopedAdmin,
    admin_roles,
    pretty_json,
)
from changesets.admin import pages, revert, trash
from changesets.admin.changelist import (
    AuthorFilter,
    BranchFilter,
    ChangesetQuerySet,
    NamespaceFilter,
)
from changesets.admin.search import matching_revisions, parse_changeset_ref
from changesets.models import Changeset, JournalEntry, JournalPhase, Revision
from entities.store import EntityKey

# --- changesets ---------------------------------------------------------------------


@admin.register(Changeset)
class ChangesetAdmin(NamespaceScopedAdmin):
    namespaces_array_field = "namespaces"
    list_display = (
        "seq_label",
        "id",
        "at_label",
        "author_label",
        "rpc_name",
        "branch_label",
        "ops",
        "namespace_list",
        "journal_label",
    )
    list_display_links = ("seq_label", "id")
    list_filter = (AuthorFilter, "rpc", BranchFilter, NamespaceFilter)
    date_hierarchy = "at"
    search_fields = ("=id",)  # shows the search box; get_search_results does the work
    search_help_text = "Exact: an entity slug, namespace/kind/slug, a changeset id, or #seq."
    ordering = ("-seq",)
    sortable_by = ("seq_label", "at_label")
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts would COUNT(*) per choice
    paginator = EstimatedCountPaginator
    list_per_page = 50
    list_select_related = ("journal",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        return ChangesetQuerySet(model=qs.model, query=qs.query, using=qs.db)

    def get_list_display(self, request: HttpRequest) -> Any:
        readable = admin_roles(request).readable()

        @admin.display(description="namespaces")
        def namespaces(obj: Changeset) -> str:
            # Only names the user can read (invariant 8).
            return ", ".join(ns for ns in obj.namespaces if readable is None or ns in readable)

        return [namespaces if f == "namespace_list" else f for f in self.list_display]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        ref = parse_changeset_ref(term)
        if ref is not None:
            return queryset.filter(**ref), False
        matches = matching_revisions(term, readable=admin_roles(request).readable())
        if matches is None:
            return queryset.none(), False
        # A list of ids, not a subquery: the plan is an index probe per id,
        # whatever the planner would guess about the search's row count.
        return queryset.filter(pk__in={cs for _, cs in matches}), False

    class Media:
        css = {"all": ("changesets/admin.css",)}

    @admin.display(description="time", ordering="at")
    def at_label(self, obj: Changeset) -> str:
        return timezone.localtime(obj.at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="author")
    def author_label(self, obj: Changeset) -> str:
        return obj.author_name

    @admin.display(description="ops")
    def ops(self, obj: Changeset) -> int:
        return obj.op_count

    @admin.display(description="rpc")
    def rpc_name(self, obj: Changeset) -> str:
        return obj.rpc  # the API's name (PutEntity), not the choice label

    @admin.display(description="#", ordering="seq")
    def seq_label(self, obj: Changeset) -> str:
        return f"#{obj.seq}"

    @admin.display(description="namespaces")
    def namespace_list(self, obj: Changeset) -> str:
        # Replaced per request by get_list_display with the readable names only.
        return ", ".join(obj.namespaces)

    @admin.display(description="branch")
    def branch_label(self, obj: Changeset) -> str:
        return obj.branch or "—"

    @admin.display(description="journal")
    def journal_label(self, obj: Changeset) -> str:
        try:
            return obj.journal.phase
        except JournalEntry.DoesNotExist:
            return "—"

    def get_urls(self) -> list[Any]:
        revert = self.admin_site.admin_view(self.revert_view)
        return [
            path("<path:object_id>/revert/", revert, name="changesets_changeset_revert"),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: Any = None,
    ) -> HttpResponse:
        return pages.changeset_detail(self, request, object_id)

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        # Django's LogEntry history would always be empty: the log is the history.
        return HttpResponseRedirect(reverse("admin:changesets_changeset_change", args=[object_id]))

    def revert_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return revert.revert_view(self, request, object_id)


# --- revisions --------------------------------------------------------------------


@admin.register(Revision)
class RevisionAdmin(NamespaceScopedAdmin):
    namespace_field = "namespace"
    list_display = (
        "seq",
        "changeset_link",
        "branch",
        "namespace",
        "kind",
        "slug",
        "op",
        "before_version",
        "after_version",
    )
    list_filter = ("op",)
    search_fields = ("=slug",)
    search_help_text = "Exact: an entity slug, or namespace/kind/slug."
    ordering = ("-seq",)
    sortable_by = ("seq",)
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts would COUNT(*) per choice
    paginator = EstimatedCountPaginator
    list_per_page = 50
    fields = (
        "changeset_link",
        "seq",
        "branch",
        "entity_link",
        "op",
        "before_version",
        "after_version",
        "diff",
    )
    readonly_fields = fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        matches = matching_revisions(term, readable=admin_roles(request).readable())
        if matches is None:
            return queryset.none(), False
        return queryset.filter(pk__in=[rid for rid, _ in matches]), False

    @admin.display(description="changeset")
    def changeset_link(self, obj: Revision) -> str:
        return format_html(
            '<a href="{}">{}</a>', pages.changeset_url(obj.changeset_id), obj.changeset_id
        )

    @admin.display(description="entity")
    def entity_link(self, obj: Revision) -> str:
        key = EntityKey(obj.namespace, obj.kind, obj.slug)
        return format_html('<a href="{}">{} (history)</a>', pages.history_url(key, obj.branch), key)

    @admin.display(description="before → after")
    def diff(self, obj: Revision) -> str:
        def side(image: Any) -> str:
            if image is None:
                return format_html("<em>{}</em>", "absent")
            return format_html("<pre>{}</pre>", pretty_json(image))

        return format_html(
            '<table class="atlas-pair"><tr><th>before</th><th>after</th></tr>'
            "<tr><td>{}</td><td>{}</td></tr></table>",
            side(obj.before),
            side(obj.after),
        )

    def get_urls(self) -> list[Any]:
        history = self.admin_site.admin_view(self.entity_history_view)
        as_of = self.admin_site.admin_view(self.entity_as_of_view)
        site = self.admin_site
        return [
            path(
                "deleted/",
                site.admin_view(self.trash_index_view),
                name="changesets_revision_deleted_index",
            ),
            path(
                "deleted/<str:namespace>/",
                site.admin_view(self.trash_view),
                name="changesets_revision_deleted",
            ),
            path(
                "deleted/<str:namespace>/<str:kind>/<str:slug>/restore/",
                site.admin_view(self.restore_view),
                name="changesets_revision_restore",
            ),
            path(
                "entity/<str:namespace>/<str:kind>/<str:slug>/",
                history,
                name="changesets_revision_entity_history",
            ),
            path(
                "entity/<str:namespace>/<str:kind>/<str:slug>/as-of/<uuid:changeset_id>/",
                as_of,
                name="changesets_revision_entity_as_of",
            ),
            *super().get_urls(),
        ]

    def entity_history_view(
        self, request: HttpRequest, namespace: str, kind: str, slug: str
    ) -> HttpResponse:
        return pages.entity_history_view(self, request, namespace, kind, slug)

    def trash_index_view(self, request: HttpRequest) -> HttpResponse:
        return trash.trash_index_view(self, request)

    def trash_view(self, request: HttpRequest, namespace: str) -> HttpResponse:
        return trash.trash_view(self, request, namespace)

    def restore_view(
        self, request: HttpRequest, namespace: str, kind: str, slug: str
    ) -> HttpResponse:
        return trash.restore_view(self, request, namespace, kind, slug)

    def entity_as_of_view(
        self, request: HttpRequest, namespace: str, kind: str, slug: str, changeset_id: Any
    ) -> HttpResponse:
        return pages.entity_as_of_view(self, request, namespace, kind, slug, str(changeset_id))


# --- journal --------------------------------------------------------------------------


@admin.register(JournalEntry)
class JournalEntryAdmin(NamespaceScopedAdmin):
    namespaces_array_field = "changeset__namespaces"
    list_display = (
        "changeset_link",
        "phase",
        "created_at",
        "published_at",
        "attempts",
        "failures",
        "error_excerpt",
    )
    list_filter = ("phase",)
    # Newest first off an index, never a sort of the whole journal: the primary key
    # (UUIDv7, time-ordered) for every entry, ``journal_pending`` (seq) for the
    # outstanding ones, which are few among many.
    ordering = ("-changeset_id",)
    sortable_by = ()
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts would COUNT(*) per choice
    paginator = EstimatedCountPaginator
    list_select_related = ("changeset",)

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        if request.GET.get("phase__exact") == JournalPhase.COMMITTED:
            return ("-seq",)
        return self.ordering

    @admin.display(description="changeset")
    def changeset_link(self, obj: JournalEntry) -> str:
        return format_html(
            '<a href="{}">#{}</a>', pages.changeset_url(obj.changeset_id), obj.changeset.seq
        )

    @admin.display(description="last error")
    def error_excerpt(self, obj: JournalEntry) -> str:
        return obj.last_error[:120]
