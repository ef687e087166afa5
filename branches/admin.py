"""Read-only browsing of branches and their overlays.

Branches change only through ``branches.services`` (create, merge, abandon)
and overlay rows only through the write service, so the admin never edits
either (DESIGN invariant 1). A branch is listed for its creator, its members
and readers of any namespace it wrote (as in the API), with the admin's roles
(``docs/admin.md``); its diff summary counts and lists only what the user
can read.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from atlas.admin_mixins import (
    EstimatedCountPaginator,
    NamespaceScopedAdmin,
    ReadOnlyAdmin,
    admin_roles,
    admin_user,
)
from branches.admin_merge import merge_view
from branches.models import Branch, BranchEntity, BranchMember, BranchStatus
from branches.selectors import branch_diff, member_names


def _history_link(change: Any, branch: str) -> str:
    key = change.key
    try:
        url = reverse(
            "admin:changesets_revision_entity_history", args=[key.namespace, key.kind, key.slug]
        )
    except NoReverseMatch:
        return str(key)
    return format_html('<a href="{}?{}">{}</a>', url, urlencode({"branch": branch}), key)


@admin.register(Branch)
class BranchAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "status",
        "created_by_name",
        "created_at",
        "fork_seq",
        "closed_at",
        "namespace_list",
    )
    list_filter = ("status",)
    search_fields = ("name", "created_by_name", "comment")
    ordering = ("-created_at",)
    fields = (
        "name",
        "status",
        "comment",
        "created_by_name",
        "created_at",
        "fork_seq",
        "fork_changeset",
        "base_seq",
        "synced_at",
        "merged_changeset",
        "closed_at",
        "namespace_list",
        "member_list",
        "diff_summary",
    )
    readonly_fields = fields

    def get_urls(self) -> list[Any]:
        merge = self.admin_site.admin_view(self.merge_view)
        return [
            path("<path:object_id>/merge/", merge, name="branches_branch_merge"),
            *super().get_urls(),
        ]

    def merge_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return merge_view(self, request, object_id)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        readable = admin_roles(request).readable()
        if readable is None:
            return qs
        user_id = admin_user(request).pk
        memberships = BranchMember.objects.filter(user_id=user_id).values("branch_id")
        return qs.filter(
            Q(created_by_id=user_id) | Q(namespaces__overlap=readable) | Q(pk__in=memberships)
        )

    def get_list_display(self, request: HttpRequest) -> Any:
        readable = admin_roles(request).readable()

        @admin.display(description="namespaces")
        def namespaces(obj: Branch) -> str:
            return ", ".join(ns for ns in obj.namespaces if readable is None or ns in readable)

        return [namespaces if f == "namespace_list" else f for f in self.list_display]

    @admin.display(description="namespaces")
    def namespace_list(self, obj: Branch) -> str:
        # In the list, replaced per request by the readable names only.
        readable = getattr(obj, "_readable", None)
        return ", ".join(ns for ns in obj.namespaces if readable is None or ns in readable)

    @admin.display(description="members")
    def member_list(self, obj: Branch) -> str:
        return ", ".join(member_names([obj])[obj.pk])

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            # The detail's readonly fields read these (they get no request).
            obj._readable = admin_roles(request).readable()
        return obj

    @admin.display(description="diff against baseline")
    def diff_summary(self, obj: Branch) -> str:
        diff = branch_diff(branch=obj, namespaces=getattr(obj, "_readable", None))
        head = format_html(
            "<p>Baseline has moved <strong>{}</strong> changeset{} since {}; "
            "the branch has <strong>{}</strong> changeset{} of its own and differs from "
            "baseline in <strong>{}</strong> entit{} ({} in conflict).</p>{}",
            diff.behind,
            "" if diff.behind == 1 else "s",
            "the fork" if obj.synced_at is None else "the last sync",
            diff.ahead,
            "" if diff.ahead == 1 else "s",
            len(diff.changes),
            "y" if len(diff.changes) == 1 else "ies",
            sum(1 for c in diff.changes if c.conflict),
            format_html(
                '<p><a class="button" id="branch-merge-link" href="{}">Merge pointer by pointer…'
                "</a></p>",
                reverse("admin:branches_branch_merge", args=[obj.pk]),
            )
            if obj.status == BranchStatus.OPEN and diff.changes
            else "",
        )
        if not diff.changes:
            return head
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    c.op,
                    _history_link(c, obj.name),
                    c.base_version if c.base_version is not None else "—",
                    c.baseline_version if c.baseline_version is not None else "—",
                    "conflict: baseline moved" if c.conflict else "",
                )
                for c in diff.changes[:500]
            ),
        )
        return format_html(
            '{}<table id="branch-diff"><thead><tr><th>op</th><th>entity</th>'
            "<th>forked from version</th><th>baseline version now</th><th></th></tr></thead>"
            "<tbody>{}</tbody></table>",
            head,
            rows,
        )


@admin.register(BranchEntity)
class BranchEntityAdmin(NamespaceScopedAdmin):
    namespace_field = "namespace_id"
    list_display = ("branch", "namespace_id", "kind", "slug", "deleted", "version", "base_version")
    list_filter = ("deleted",)
    search_fields = ("=slug", "=branch__name")
    list_select_related = ("branch",)
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts would COUNT(*) per choice
    paginator = EstimatedCountPaginator
