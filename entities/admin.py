"""Namespaces (with their role grants) and entities in the admin.

Entities are read-only (only the write service changes them, invariant 1)
and limited to the namespaces the user can read (``docs/admin.md``). An
entity's history and as-of pages belong to the log, so they live in the
changesets admin; this module links to them by URL name and imports nothing
from ``changesets`` (the app dependency runs entities <- changesets).
"""

from __future__ import annotations

import re
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html
from guardian.models import GroupObjectPermission, UserObjectPermission

from atlas.admin_mixins import (
    EstimatedCountPaginator,
    NamespaceScopedAdmin,
    admin_roles,
    loose_index_scan,
    pretty_json,
    readable_namespace_choices,
)
from atlas.exceptions import AtlasError
from entities.access import Role
from entities.models import Entity, Namespace
from entities.services import (
    ALL_PERMISSIONS,
    ROLE_NAMES,
    namespace_create,
    namespace_update,
    role_grant,
    role_revoke,
)
from entities.validation import MSG_NAMESPACE, is_valid_namespace

MAX_MATCHES = 5000
_SLUG_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
_ROLE_OF = {codename: role for role, codename in enumerate(ALL_PERMISSIONS, start=1)}


# --- namespaces and roles ----------------------------------------------------------


class NamespaceForm(forms.ModelForm):
    class Meta:
        model = Namespace
        fields = ("name", "protected")

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if not is_valid_namespace(name):
            raise forms.ValidationError(MSG_NAMESPACE)
        return name


class RoleForm(forms.Form):
    principal_type = forms.ChoiceField(choices=[("user", "user"), ("group", "group")])
    principal = forms.CharField(max_length=150, label="user or group name")
    role = forms.ChoiceField(
        choices=[(name, name) for name in ROLE_NAMES] + [("none", "none (revoke)")]
    )

    def clean(self) -> dict[str, Any]:
        data = cast("dict[str, Any]", super().clean())  # Form.clean returns cleaned_data
        kind, name = data.get("principal_type"), data.get("principal")
        if kind and name:
            found: Model | None
            if kind == "user":
                found = get_user_model().objects.filter(username=name).first()
            else:
                found = Group.objects.filter(name=name).first()
            if found is None:
                raise forms.ValidationError(f"No {kind} named {name!r}.")
            data["found"] = found
        return data


def namespace_grants(namespace: Namespace) -> list[dict[str, Any]]:
    """Every user and group with a role in ``namespace``, highest role per principal."""
    ct = ContentType.objects.get_for_model(Namespace)
    grants: dict[tuple[str, str], int] = {}
    user_rows = UserObjectPermission.objects.filter(
        content_type=ct, object_pk=namespace.pk
    ).values_list("user__username", "permission__codename")
    group_rows = GroupObjectPermission.objects.filter(
        content_type=ct, object_pk=namespace.pk
    ).values_list("group__name", "permission__codename")
    for kind, rows in (("user", user_rows), ("group", group_rows)):
        for name, codename in rows:
            level = _ROLE_OF.get(codename, 0)
            grants[(kind, name)] = max(grants.get((kind, name), 0), level)
    return [
        {"type": kind, "name": name, "role": Role(level).name.lower()}
        for (kind, name), level in sorted(grants.items())
    ]


@admin.register(Namespace)
class NamespaceAdmin(admin.ModelAdmin):
    """Namespaces and who holds which role there.

    Creating and editing go through ``entities.services`` (validation, one
    transaction); roles are granted with ``role_grant`` so a grant is always
    a whole role (reader, writer or maintainer), never a loose permission.
    Namespaces have no default model permissions, so this page is for
    superusers.
    """

    form = NamespaceForm
    list_display = ("name", "protected", "created_at", "roles_link")
    list_filter = ("protected",)
    search_fields = ("name",)
    change_form_template = "admin/entities/namespace/change_form.html"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("name", "created_at") if obj else ("created_at",)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # entities and their history hang off the namespace

    def save_model(self, request: HttpRequest, obj: Namespace, form: Any, change: bool) -> None:
        if change:
            saved = namespace_update(name=obj.pk, protected=obj.protected)
        else:
            saved = namespace_create(name=obj.name, protected=obj.protected)
        obj.created_at = saved.created_at
        obj._state.adding = False

    @admin.display(description="roles")
    def roles_link(self, obj: Namespace) -> str:
        url = reverse("admin:entities_namespace_roles", args=[obj.pk])
        return format_html('<a href="{}">manage roles</a>', url)

    def get_urls(self) -> list[Any]:
        roles = self.admin_site.admin_view(self.roles_view)
        return [
            path("<path:object_id>/roles/", roles, name="entities_namespace_roles"),
            *super().get_urls(),
        ]

    def roles_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        namespace = Namespace.objects.filter(pk=object_id).first()
        if namespace is None:
            raise Http404("No such namespace.")
        if not self.has_change_permission(request, namespace):
            raise PermissionDenied
        form = RoleForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            principal, role = form.cleaned_data["found"], form.cleaned_data["role"]
            label = f"{form.cleaned_data['principal_type']} {principal}"
            try:
                if role == "none":
                    role_revoke(namespace=namespace, principal=principal)
                    messages.success(request, f"Revoked every role of {label} in {namespace}.")
                else:
                    role_grant(namespace=namespace, principal=principal, role=role)
                    messages.success(request, f"{label} is now {role} in {namespace}.")
            except AtlasError as exc:
                messages.error(request, exc.detail)
            return HttpResponseRedirect(request.path)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "original": namespace,
            "title": f"Roles in {namespace}",
            "grants": namespace_grants(namespace),
            "form": form,
        }
        return render(request, "admin/entities/namespace/roles.html", context)


# --- entities -------------------------------------------------------------------------


class EntityNamespaceFilter(admin.SimpleListFilter):
    title = "namespace"
    parameter_name = "namespace"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return readable_namespace_choices(request, limit=100)

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        value = self.value()
        return queryset.filter(namespace_id=value) if value else None


def _history_url(namespace: str, kind: str, slug: str) -> str | None:
    try:
        return reverse("admin:changesets_revision_entity_history", args=[namespace, kind, slug])
    except NoReverseMatch:  # the changesets admin is not installed
        return None


@admin.register(Entity)
class EntityAdmin(NamespaceScopedAdmin):
    namespace_field = "namespace_id"
    list_display = ("namespace_id", "kind", "slug", "version", "updated_at", "history_link")
    list_display_links = ("slug",)
    list_filter = (EntityNamespaceFilter,)
    search_fields = ("=slug",)
    search_help_text = "Exact: an entity slug, or namespace/kind/slug."
    ordering = ("namespace", "kind", "slug")
    sortable_by = ()
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts would COUNT(*) per choice
    paginator = EstimatedCountPaginator
    list_per_page = 50
    # Adds a "Deleted entities" link (the changesets admin's trash, by URL name).
    change_list_template = "admin/entities/entity/change_list.html"
    fields = (
        "key",
        "version",
        "created_at",
        "updated_at",
        "last_changeset",
        "history_link",
        "content_json",
    )
    readonly_fields = fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """Exact slug or key, by index seeks on ``(namespace, kind, slug)``.

        For a bare slug, the distinct ``(namespace, kind)`` prefixes are read
        with a loose index scan, then each ``(prefix, slug)`` is one seek.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        parts = term.split("/")
        if len(parts) == 3 and _SLUG_RE.match(parts[2]):
            ns, kind, slug = parts
            return queryset.filter(namespace_id=ns, kind=kind, slug=slug), False
        if len(parts) != 1 or not _SLUG_RE.match(term):
            return queryset.none(), False
        prefixes = loose_index_scan(table="entities_entity", columns=["namespace_id", "kind"])
        readable = admin_roles(request).readable()
        if readable is not None:
            prefixes = [p for p in prefixes if p[0] in set(readable)]
        if not prefixes:
            return queryset.none(), False
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT e.id FROM unnest(%s::text[], %s::text[]) AS p(ns, kind)"
                " JOIN entities_entity e ON e.namespace_id = p.ns AND e.kind = p.kind"
                " AND e.slug = %s LIMIT %s",
                [[p[0] for p in prefixes], [p[1] for p in prefixes], term, MAX_MATCHES],
            )
            ids = [row[0] for row in cursor.fetchall()]
        return queryset.filter(pk__in=ids), False

    @admin.display(description="entity")
    def key(self, obj: Entity) -> str:
        return f"{obj.namespace_id}/{obj.kind}/{obj.slug}"

    @admin.display(description="history")
    def history_link(self, obj: Entity) -> str:
        url = _history_url(obj.namespace_id, obj.kind, obj.slug)
        return format_html('<a href="{}">history</a>', url) if url else "—"

    @admin.display(description="last changed by")
    def last_changeset(self, obj: Entity) -> str:
        try:
            url = reverse("admin:changesets_changeset_change", args=[str(obj.changeset_id)])
        except NoReverseMatch:
            return str(obj.changeset_id)
        return format_html('<a href="{}">{}</a>', url, obj.changeset_id)

    @admin.display(description="content")
    def content_json(self, obj: Entity) -> str:
        return format_html('<pre class="atlas-json-block">{}</pre>', pretty_json(obj.content))

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        """The entity's "History" button opens its revision timeline, not Django's LogEntry."""
        entity = None
        if object_id.isdigit():
            entity = self.get_queryset(request).filter(pk=object_id).first()
        if entity is None or not self.has_view_permission(request, entity):
            raise Http404("No such entity.")
        url = _history_url(entity.namespace_id, entity.kind, entity.slug)
        if url is None:
            raise Http404("No history pages.")
        return HttpResponseRedirect(url)
