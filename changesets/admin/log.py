"""The log in the admin: changesets, revisions and journal entries, read-only.

Built for millions of rows (issue 18): pages by key, never by offset, and
counts nothing (:mod:`atlas.admin_keyset`); filters that are seeks or typed
(``changelist.py``); search by exact entity, driven from the revision history
index and paged by key, or by id (``search.py``). Rows are limited to the
namespaces the user can read (``docs/admin.md``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from atlas.admin_keyset import KeysetAdminMixin, page_position
from atlas.admin_mixins import NamespaceScopedAdmin, admin_roles, pretty_json
from changesets.admin import archive, pages, revert, trash
from changesets.admin.changelist import AuthorFilter, BranchFilter, NamespaceFilter, UntilFilter
from changesets.admin.search import (
    Candidate,
    changeset_ref,
    entity_prefixes,
    search_page,
)
from changesets.models import COMMON_RPCS, Changeset, JournalEntry, JournalPhase, Revision
from changesets.selectors import by_namespace
from changesets.selectors.log import visible_changesets
from entities.store import EntityKey

# --- changesets ---------------------------------------------------------------------


def search_by_entity(
    model_admin: KeysetAdminMixin,
    request: HttpRequest,
    queryset: QuerySet,
    term: str,
    keep: Any,
    key_field: str,
) -> QuerySet:
    """``queryset`` narrowed to one page of the entity search (``search.py``).

    ``keep(queryset, batch)`` returns the keys of the candidates the filtered
    queryset holds. When the search stops early, ``request.atlas_keyset_resume``
    tells the changelist where "older" resumes (``atlas.admin_keyset``).
    """
    found = entity_prefixes(term, readable=admin_roles(request).readable())
    if found is None:
        return queryset.none()
    slug, combos = found
    fields = model_admin.get_keyset_fields(request)
    direction, start = page_position(request, len(fields))
    if start is not None and len(start) == 1:
        # A changeset page's position is its seq: resume below all of that seq's rows.
        start = (start[0], 0) if direction == "before" else (start[0], 2**62)
    page = search_page(
        slug,
        combos,
        direction=direction,
        start=start,
        want=model_admin.list_per_page + 1,
        keep=lambda batch: keep(queryset, batch),
    )
    if page.resume is not None and direction == "before":
        resume = page.resume
        request.atlas_keyset_resume = (  # type: ignore[attr-defined]
            (resume.seq,) if len(fields) == 1 else (resume.seq, resume.id)
        )
    return queryset.filter(**{f"{key_field}__in": page.keys})


def _changesets_kept(queryset: QuerySet, batch: list[Candidate]) -> list[int]:
    seqs = {c.seq for c in batch}
    hits = set(queryset.filter(seq__in=seqs).values_list("seq", flat=True))
    return [c.seq for c in batch if c.seq in hits]


def _revisions_kept(queryset: QuerySet, batch: list[Candidate]) -> list[int]:
    hits = set(queryset.filter(pk__in=[c.id for c in batch]).values_list("pk", flat=True))
    return [c.id for c in batch if c.id in hits]


@admin.register(Changeset)
class ChangesetAdmin(archive.ArchiveBanner, KeysetAdminMixin, NamespaceScopedAdmin):
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
    list_filter = (AuthorFilter, "rpc", BranchFilter, NamespaceFilter, UntilFilter)
    search_fields = ("=id",)  # shows the search box; get_search_results does the work
    search_help_text = "Exact: an entity slug, namespace/kind/slug, a changeset id, or #seq."
    ordering = ("-seq",)
    keyset_fields = ("seq",)
    list_per_page = 50
    list_select_related = ("journal",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        """The scoped changesets (:meth:`_scoped`), after the archive cut if there is one."""
        return archive.after_cut(self._scoped(request))

    def _scoped(self, request: HttpRequest) -> QuerySet:
        """Scoped to the readable namespaces, or on the changelist to the readable
        namespace its filter names, the whole visibility test (with the overlap as
        well, the planner squared its share and sorted the namespace's every
        changeset: issue 18); ``NamespaceFilter`` then adds nothing."""
        readable = admin_roles(request).readable()
        match = request.resolver_match
        wanted = request.GET.get(NamespaceFilter.parameter_name)
        on_changelist = match is not None and match.url_name == "changesets_changeset_changelist"
        rpc = request.GET.get("rpc__exact")
        if on_changelist and rpc and rpc not in COMMON_RPCS:
            # A rare rpc drives from its index (``visible_changesets`` says why),
            # and so does a readable namespace filter beside it.
            if wanted and (readable is None or wanted in readable):
                request.atlas_scoped_to = wanted  # type: ignore[attr-defined]
                return visible_changesets([wanted], seek_elsewhere=True)
            if readable is not None:
                return visible_changesets(readable, seek_elsewhere=True)
        if readable is None or not on_changelist or not wanted or wanted not in readable:
            return super().get_queryset(request)
        request.atlas_scoped_to = wanted  # type: ignore[attr-defined]
        return self.model._default_manager.filter(by_namespace.touching([wanted]))

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
        ref = changeset_ref(term)
        if ref is not None:
            return queryset.filter(**ref), False
        # A list of seqs, not a subquery: the plan is an index probe per seq,
        # whatever the planner would guess about the search's row count.
        return search_by_entity(self, request, queryset, term, _changesets_kept, "seq"), False

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
        """The entry's phase while it is outstanding; a baseline changeset without
        one was published (publishing deletes the entry); a branch one has none."""
        try:
            return obj.journal.phase
        except JournalEntry.DoesNotExist:
            return "—" if obj.branch else JournalPhase.PUBLISHED

    def get_urls(self) -> list[Any]:
        revert = self.admin_site.admin_view(self.revert_view)
        return [
            path("<path:object_id>/revert/", revert, name="changesets_changeset_revert"),
            *super().get_urls(),
        ]

    @archive.shows_archived
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

    @archive.shows_archived
    def revert_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return revert.revert_view(self, request, object_id)


# --- revisions --------------------------------------------------------------------


@admin.register(Revision)
class RevisionAdmin(archive.ArchiveBanner, KeysetAdminMixin, NamespaceScopedAdmin):
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
    ordering = ("-seq", "-id")
    # A changeset's revisions share its seq: the id breaks the tie.
    keyset_fields = ("seq", "id")
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

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return archive.after_cut(super().get_queryset(request))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        page = search_by_entity(self, request, queryset, term, _revisions_kept, "pk")
        return page, False

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
        archive.banner(request)
        return pages.entity_history_view(self, request, namespace, kind, slug)

    def trash_index_view(self, request: HttpRequest) -> HttpResponse:
        return trash.trash_index_view(self, request)

    def trash_view(self, request: HttpRequest, namespace: str) -> HttpResponse:
        return trash.trash_view(self, request, namespace)

    @archive.shows_archived
    def restore_view(
        self, request: HttpRequest, namespace: str, kind: str, slug: str
    ) -> HttpResponse:
        return trash.restore_view(self, request, namespace, kind, slug)

    @archive.shows_archived
    def entity_as_of_view(
        self, request: HttpRequest, namespace: str, kind: str, slug: str, changeset_id: Any
    ) -> HttpResponse:
        return pages.entity_as_of_view(self, request, namespace, kind, slug, str(changeset_id))


# --- journal --------------------------------------------------------------------------


@admin.register(JournalEntry)
class JournalEntryAdmin(KeysetAdminMixin, NamespaceScopedAdmin):
    """Post-commit work still owed: publishing deletes an entry, so every entry here
    is outstanding, and the failing ones show their attempts and last error."""

    namespaces_array_field = "changeset__namespaces"
    list_display = ("changeset_link", "created_at", "attempts", "failures", "error_excerpt")
    # Newest first off ``journal_pending`` (outstanding entries by seq), never a sort
    # of the whole journal (issue 18).
    ordering = ("-seq",)
    keyset_fields = ("seq",)
    list_per_page = 50
    list_select_related = ("changeset",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        """Outstanding entries (rows an older process marked ``published`` during an
        upgrade are done work, and ``journal_pending`` holds only these)."""
        return super().get_queryset(request).filter(phase=JournalPhase.COMMITTED)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Django's "Select journal entry to view" reads as if published entries were
        # here too; an empty page is the healthy one.
        title = {"title": "Journal entries still to publish"}
        return super().changelist_view(request, {**title, **(extra_context or {})})

    @admin.display(description="changeset")
    def changeset_link(self, obj: JournalEntry) -> str:
        return format_html(
            '<a href="{}">#{}</a>', pages.changeset_url(obj.changeset_id), obj.changeset.seq
        )

    @admin.display(description="last error")
    def error_excerpt(self, obj: JournalEntry) -> str:
        return obj.last_error[:120]
