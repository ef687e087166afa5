"""The archive in the admin: the cuts (read-only), per-namespace retention, and what the
log pages show about the cut (a banner on the lists, a page instead of a 500 for
anything archived). Retention is edited by superusers only (docs/retention.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from changesets.archive import boundary
from changesets.archive.models import ArchiveCut, ArchiveRewrite, NamespaceRetention
from changesets.exceptions import Archived


def banner(request: HttpRequest) -> None:
    """On a log page after a cut: say where the hot log begins and where the rest is."""
    cut = boundary.current()
    if cut is not None:
        messages.info(
            request,
            f"History through seq {cut.seq} is archived (checkpoint {cut.hash[:16]}…,"
            f" archive {cut.location}); these pages show the log after it.",
        )


def after_cut(queryset: QuerySet) -> QuerySet:
    """The log after the archive cut (rows through it may linger while they are removed)."""
    floor = boundary.floor()
    return queryset.filter(seq__gt=floor) if floor else queryset


class ArchiveBanner:
    """A log changelist that says, after a cut, where the hot log begins."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        banner(request)
        return super().changelist_view(request, extra_context)  # type: ignore[misc]


def archived_page(model_admin: Any, request: HttpRequest, exc: Archived) -> HttpResponse:
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Archived",
        "detail": exc.detail,
        "seq": exc.seq,
        "checkpoint": exc.checkpoint,
        "archive": exc.archive,
        "changelist_url": reverse("admin:changesets_changeset_changelist"),
    }
    return render(request, "admin/changesets/archived.html", context, status=410)


def shows_archived(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A model admin view that answers a page, not an error, for anything archived."""

    @functools.wraps(view)
    def wrapped(model_admin: Any, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(model_admin, request, *args, **kwargs)
        except Archived as exc:
            return archived_page(model_admin, request, exc)

    return wrapped


class _SuperuserOnly:
    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)


class _ReadOnly(_SuperuserOnly):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ArchiveCut)
class ArchiveCutAdmin(_ReadOnly, admin.ModelAdmin):
    list_display = ("seq", "from_seq", "state", "changesets", "revisions", "signed_at", "location")
    ordering = ("-seq",)
    readonly_fields = [f.name for f in ArchiveCut._meta.fields]


@admin.register(ArchiveRewrite)
class ArchiveRewriteAdmin(_ReadOnly, admin.ModelAdmin):
    """The record of each erasure carried into the archive (which files, when)."""

    list_display = ("erasure_id", "cut", "state", "created_at", "done_at")
    ordering = ("-created_at",)
    readonly_fields = [f.name for f in ArchiveRewrite._meta.fields]


@admin.register(NamespaceRetention)
class NamespaceRetentionAdmin(_SuperuserOnly, admin.ModelAdmin):
    list_display = ("namespace", "days", "updated_at")
    ordering = ("namespace",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.has_module_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)
