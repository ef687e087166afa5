from __future__ import annotations

from django.contrib import admin
from guardian.admin import GuardedModelAdmin

from atlas.admin_mixins import ReadOnlyAdmin
from entities.models import Entity, Namespace


@admin.register(Namespace)
class NamespaceAdmin(GuardedModelAdmin):
    """Namespaces and their role grants (guardian's object-permissions page)."""

    list_display = ("name", "protected", "created_at")
    list_filter = ("protected",)
    search_fields = ("name",)

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        return ("name", "created_at") if obj else ("created_at",)

    def has_delete_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False  # entities and their history hang off the namespace


@admin.register(Entity)
class EntityAdmin(ReadOnlyAdmin):
    list_display = ("namespace", "kind", "slug", "version", "updated_at", "changeset_id")
    list_filter = ("namespace",)
    search_fields = ("slug", "kind")
    list_select_related = ("namespace",)
    show_full_result_count = False
