from __future__ import annotations

from django.contrib import admin

from atlas.admin_mixins import ReadOnlyAdmin
from changesets.models import Changeset, JournalEntry, Revision


class RevisionInline(admin.TabularInline):
    model = Revision
    fields = ("namespace", "kind", "slug", "op", "before_version", "after_version")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False


@admin.register(Changeset)
class ChangesetAdmin(ReadOnlyAdmin):
    list_display = ("seq", "id", "at", "author_name", "rpc", "branch", "op_count")
    list_filter = ("rpc", "branch")
    search_fields = ("=id", "author_name", "comment")
    ordering = ("-seq",)
    show_full_result_count = False
    inlines = [RevisionInline]


@admin.register(Revision)
class RevisionAdmin(ReadOnlyAdmin):
    list_display = ("seq", "namespace", "kind", "slug", "op", "before_version", "after_version")
    list_filter = ("op", "branch")
    search_fields = ("slug",)
    ordering = ("-seq",)
    show_full_result_count = False


@admin.register(JournalEntry)
class JournalEntryAdmin(ReadOnlyAdmin):
    list_display = ("changeset", "phase", "created_at", "published_at", "attempts")
    list_filter = ("phase",)
    ordering = ("-created_at",)
