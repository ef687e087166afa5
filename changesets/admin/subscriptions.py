"""Subscriptions in the admin: browse their delivery state (read-only).

Subscriptions are created and changed through the API
(``changesets.outbox.subscriptions``), which validates URLs and wakes the pump; the
admin shows status, lag, the last error and a parked (dead-letter) delivery,
and never an HMAC secret. Retry and skip are the API's
(``POST /subscriptions/{id}/retry`` and ``/skip``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from atlas.admin_mixins import ReadOnlyAdmin, admin_roles
from changesets.models import Subscription
from changesets.outbox.subscriptions import subscription_lag


class ParkedFilter(admin.SimpleListFilter):
    title = "parked"
    parameter_name = "parked"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "parked"), ("no", "not parked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(parked_seq__isnull=False)
        if self.value() == "no":
            return queryset.filter(parked_seq__isnull=True)
        return queryset


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "url",
        "status",
        "lag",
        "cursor_seq",
        "last_delivery_at",
        "consecutive_failures",
        "parked",
        "error_excerpt",
    )
    list_filter = ("active", "capture", ParkedFilter)
    search_fields = ("name", "url")
    ordering = ("created_at", "id")
    fields = (
        "id",
        "name",
        "url",
        "namespaces",
        "capture",
        "active",
        "status",
        "lag",
        "cursor_seq",
        "last_delivery_at",
        "next_attempt_at",
        "consecutive_failures",
        "deliveries_ok",
        "deliveries_failed",
        "last_error",
        "parked",
        "parked_error",
        "parked_at",
        "part_seq",
        "parts_done",
        "previous_secret_expires_at",
        "created_by",
        "created_at",
        "updated_at",
    )  # never ``secret`` nor ``previous_secret``: they are HMAC keys
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        readable = admin_roles(request).readable()
        if readable is None:
            return qs
        # Only subscriptions confined to namespaces the user can read: an
        # all-namespace subscription (empty list) follows unreadable ones too.
        return qs.filter(namespaces__contained_by=readable).exclude(Q(namespaces=[]))

    @admin.display(description="status")
    def status(self, obj: Subscription) -> str:
        if obj.parked_seq is not None:
            return f"parked at seq {obj.parked_seq}: POST /subscriptions/{obj.pk}/retry or /skip"
        if not obj.active:
            return "paused"
        if obj.consecutive_failures:
            retry = ""
            if obj.next_attempt_at and obj.next_attempt_at > timezone.now():
                retry = f", retry at {obj.next_attempt_at:%Y-%m-%d %H:%M:%S}"
            return f"failing ({obj.consecutive_failures} in a row{retry})"
        return "delivering"

    @admin.display(description="parked")
    def parked(self, obj: Subscription) -> str:
        if obj.parked_seq is None:
            return "-"
        part = f" part {obj.parked_part}" if obj.parked_part else ""
        return f"seq {obj.parked_seq}{part}, {obj.parked_attempts} attempt(s)"

    @admin.display(description="lag (changesets)")
    def lag(self, obj: Subscription) -> int:
        return subscription_lag(obj)

    @admin.display(description="last error")
    def error_excerpt(self, obj: Subscription) -> str:
        return obj.last_error[:120]
