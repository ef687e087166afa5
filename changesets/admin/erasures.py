"""Erasures in the admin: read-only, who, when, why and which pointers (never the values)."""

from __future__ import annotations

from django.contrib import admin

from atlas.admin_mixins import NamespaceScopedAdmin
from changesets.models import Erasure


@admin.register(Erasure)
class ErasureAdmin(NamespaceScopedAdmin):
    # Scoped like the API: the rows of namespaces the user can read (the API
    # lists an erasure only to readers of all its namespaces; the admin's rule
    # for arrays is "any", as for changesets, and both show only pointers).
    namespaces_array_field = "namespaces"
    list_display = ("at", "id", "author_name", "reason", "namespaces", "revisions_redacted")
    list_display_links = ("at", "id")
    ordering = ("-id",)
    fields = (
        "id",
        "at",
        "author_name",
        "reason",
        "targets",
        "namespaces",
        "revisions_redacted",
        "changeset_ids",
        "prev_hash",
        "hash",
    )
    readonly_fields = fields
