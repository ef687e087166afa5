"""API tokens in the admin: prefixes only; superusers alone create and revoke.

Replaces DRF's stock token admin, which listed every key in clear to anyone
with "view token". Keys are not stored (``atlas.models.ApiToken`` keeps a
digest), so there is nothing to leak: the list and detail pages show the
key's prefix, its name, its user and when it was made. Creating a token
shows its key once, on the page that answers the form, and nowhere else
(not in a message, which would sit in a cookie or the session).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from atlas.models import ApiToken
from atlas.services import api_token_create, api_token_revoke


class ApiTokenAddForm(forms.ModelForm):
    class Meta:
        model = ApiToken
        fields = ("user", "name")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("shown_prefix", "name", "user", "created_at")
    list_select_related = ("user",)
    search_fields = ("prefix", "name", "user__username")
    ordering = ("-created_at",)
    fields = ("shown_prefix", "name", "user", "created_at")
    readonly_fields = ("shown_prefix", "name", "user", "created_at")
    raw_id_fields = ("user",)

    @admin.display(description="key", ordering="prefix")
    def shown_prefix(self, obj: ApiToken) -> str:
        return f"{obj.prefix}…"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a token is made and revoked, never edited

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_superuser

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:  # the add page
            kwargs["form"] = ApiTokenAddForm
            kwargs["fields"] = ApiTokenAddForm.Meta.fields
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ApiTokenAddForm.Meta.fields if obj is None else self.fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        token, key = api_token_create(user=obj.user, name=obj.name)
        obj.pk, obj.prefix, obj.digest, obj.created_at = (
            token.pk,
            token.prefix,
            token.digest,
            token.created_at,
        )
        obj._key = key  # for response_add only; never stored

    def response_add(self, request: HttpRequest, obj: ApiToken, *args: Any) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "API token created",
            "token": obj,
            "key": obj._key,
        }
        response = TemplateResponse(request, "atlas/admin/token_created.html", context)
        response["Cache-Control"] = "no-store"  # the key must not linger in a cache
        return response

    def delete_model(self, request: HttpRequest, obj: ApiToken) -> None:
        api_token_revoke(token=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            api_token_revoke(token=token)
