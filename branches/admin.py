"""Read-only browsing of branches and their overlays.

Branches change only through ``branches.services`` (create, merge, abandon)
and overlay rows only through the write service, so the admin never edits
either (DESIGN invariant 1).
"""

from __future__ import annotations

from django.contrib import admin

from atlas.admin_mixins import ReadOnlyAdmin
from branches.models import Branch, BranchEntity


@admin.register(Branch)
class BranchAdmin(ReadOnlyAdmin):
    list_display = ("name", "status", "created_by_name", "created_at", "fork_seq", "closed_at")
    list_filter = ("status",)
    search_fields = ("name", "created_by_name", "comment")
    ordering = ("-created_at",)


@admin.register(BranchEntity)
class BranchEntityAdmin(ReadOnlyAdmin):
    list_display = ("branch", "namespace", "kind", "slug", "deleted", "version", "base_version")
    list_filter = ("deleted",)
    search_fields = ("slug", "kind", "branch__name")
    list_select_related = ("branch",)
    show_full_result_count = False
