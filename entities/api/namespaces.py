"""Namespaces and role grants: reads for everyone; namespaces are managed by
superusers, a namespace's grants also by its maintainers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User
from drf_spectacular.utils import extend_schema, extend_schema_serializer, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import paging, strict
from atlas.api.idempotency import idempotent
from atlas.api.inputs import ChoiceOf, namespace_field
from atlas.api.openapi import PAGE_PARAMS, PROBLEM
from atlas.api.render import rfc3339
from atlas.api.viewsets import ViewSet
from atlas.exceptions import NotFound, PermissionDenied
from entities import access, services
from entities.models import Namespace
from entities.selectors import namespace_get, namespace_list

if TYPE_CHECKING:  # the stubs' name for what DRF's get_permissions returns
    from rest_framework.permissions import _SupportsHasPermission


class IsSuperuserForWrites(BasePermission):
    """Reads are open to any authenticated user (filtered); writes need a superuser."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return bool(request.user and request.user.is_authenticated)
        if not (request.user and request.user.is_authenticated):
            return False
        if not access.is_superuser(request.user):
            raise PermissionDenied("Managing namespaces needs a superuser.")
        return True


def namespace_repr(namespace: Namespace) -> dict[str, Any]:
    return {
        "name": namespace.name,
        "protected": namespace.protected,
        "created_at": rfc3339(namespace.created_at),
    }


NamespaceSerializer = inline_serializer(
    "Namespace",
    {
        "name": serializers.CharField(),
        "protected": serializers.BooleanField(),
        "created_at": serializers.DateTimeField(),
    },
)


GrantSerializer = inline_serializer(
    "Grant",
    {
        "namespace": serializers.CharField(),
        "principal_type": serializers.CharField(),
        "principal": serializers.CharField(),
        "role": serializers.CharField(),
    },
)


class NamespaceCreateSerializer(strict.Body):
    name = namespace_field()
    protected = strict.StrictBooleanField(default=False)


class NamespaceUpdateSerializer(strict.Body):
    protected = strict.StrictBooleanField()


class GrantBodySerializer(strict.Body):
    role = ChoiceOf(
        ["reader", "writer", "maintainer"], message="One of reader, writer, maintainer."
    )


@extend_schema_serializer(many=False)
class NamespacePageSerializer(serializers.Serializer):
    results = NamespaceSerializer.__class__(many=True)
    next_page_token = serializers.CharField(allow_null=True)


DETAIL_DESCRIPTION = "One namespace. Not readable = 404 first, so a PATCH confirms nothing hidden."
GRANT_DESCRIPTION = (
    "A namespace's grants: superusers and that namespace's maintainers manage them.\n\n"
    "A caller who cannot read the namespace gets 404 (not visible = not found);\n"
    "a reader or writer gets 403."
)


# Namespaces (list, create, retrieve, partial_update) and their grants. Not
# readable = 404 first, so a PATCH or a grant confirms nothing hidden. (A
# comment: drf-spectacular would print a docstring on every operation.)
class NamespaceViewSet(ViewSet):
    lookup_field = "name"

    def get_permissions(self) -> Sequence[_SupportsHasPermission]:
        # Only creating is refused up front; a PATCH or a grant answers 404 for a
        # namespace the caller cannot read before it says who may change it.
        if self.action == "create":
            return [IsSuperuserForWrites()]
        return super().get_permissions()

    @extend_schema(
        operation_id="namespaces_list",
        summary="Namespaces you can read",
        parameters=PAGE_PARAMS,
        responses={200: NamespacePageSerializer},
    )
    def list(self, request: Request) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        rows = namespace_list(user=request.user)
        page = paging.keyset_page(
            request,
            scope="namespaces",
            field="n",
            field_type=str,
            fetch=lambda after, limit: (
                rows[:limit] if after is None else rows.filter(name__gt=after)[:limit]
            ),
            position_of=lambda namespace: namespace.name,
        )
        return Response(
            {
                "results": [namespace_repr(n) for n in page.results],
                "next_page_token": page.next_page_token,
            }
        )

    @extend_schema(
        operation_id="namespaces_create",
        summary="Create a namespace (superusers)",
        request=NamespaceCreateSerializer,
        responses={201: NamespaceSerializer, 403: PROBLEM, 409: PROBLEM, 422: PROBLEM},
    )
    @idempotent
    def create(self, request: Request) -> Response:
        body = strict.validated(NamespaceCreateSerializer, request.data)
        namespace = services.namespace_create(name=body["name"], protected=body["protected"])
        return Response(namespace_repr(namespace), status=201)

    @extend_schema(
        operation_id="namespaces_get",
        description=DETAIL_DESCRIPTION,
        responses={200: NamespaceSerializer, 404: PROBLEM},
    )
    def retrieve(self, request: Request, name: str) -> Response:
        return Response(namespace_repr(_readable(request, name)))

    @extend_schema(
        operation_id="namespaces_update",
        description=DETAIL_DESCRIPTION,
        summary="Change a namespace's protection (superusers)",
        request=NamespaceUpdateSerializer,
        responses={200: NamespaceSerializer, 403: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    @idempotent
    def partial_update(self, request: Request, name: str) -> Response:
        _readable(request, name)
        if not access.is_superuser(request.user):
            raise PermissionDenied("Managing namespaces needs a superuser.")
        body = strict.validated(NamespaceUpdateSerializer, request.data)
        namespace = services.namespace_update(name=name, protected=body["protected"])
        return Response(namespace_repr(namespace))

    @extend_schema(
        operation_id="grants_put",
        description=GRANT_DESCRIPTION,
        summary="Grant a role to a user or group (superusers, maintainers)",
        request=GrantBodySerializer,
        responses={
            200: GrantSerializer,
            201: GrantSerializer,
            403: PROBLEM,
            404: PROBLEM,
            422: PROBLEM,
        },
    )
    @action(
        detail=True,
        methods=["put"],
        url_path="grants/<str:principal_type>/<str:principal>",
        url_name="grant",
    )
    @idempotent
    def grant(self, request: Request, name: str, principal_type: str, principal: str) -> Response:
        namespace, target = _grant_target(request, name, principal_type, principal)
        body = strict.validated(GrantBodySerializer, request.data)
        created = services.role_grant(namespace=namespace, principal=target, role=body["role"])
        return Response(
            {
                "namespace": namespace.name,
                "principal_type": principal_type,
                "principal": principal,
                "role": body["role"],
            },
            status=201 if created else 200,
        )

    @extend_schema(
        operation_id="grants_delete",
        description=GRANT_DESCRIPTION,
        summary="Revoke a user's or group's role (superusers, maintainers)",
        responses={204: None, 403: PROBLEM, 404: PROBLEM},
    )
    @grant.mapping.delete
    @idempotent
    def revoke(self, request: Request, name: str, principal_type: str, principal: str) -> Response:
        namespace, target = _grant_target(request, name, principal_type, principal)
        services.role_revoke(namespace=namespace, principal=target)
        return Response(status=204)


def _readable(request: Request, name: str) -> Namespace:
    namespace = namespace_get(name=name)
    if namespace is None or not access.can_read(request.user, name):
        raise NotFound("No such namespace.")
    return namespace


def _grant_target(
    request: Request, name: str, principal_type: str, principal: str
) -> tuple[Namespace, Any]:
    """The namespace and the user or group a grant names; who may manage it.

    A caller who cannot read the namespace gets 404 (not visible = not found);
    a reader or writer gets 403; superusers and its maintainers go on.
    """
    namespace = _readable(request, name)
    if access.role_in(request.user, name) < access.Role.MAINTAINER:
        raise PermissionDenied(f"Managing grants in {name!r} needs the maintainer role there.")
    target: User | Group | None
    if "\x00" in principal:  # no user or group can have it (PostgreSQL text cannot)
        target = None
    elif principal_type == "user":
        target = get_user_model().objects.filter(username=principal).first()
    elif principal_type == "group":
        target = Group.objects.filter(name=principal).first()
    else:
        target = None
    if target is None:
        raise NotFound(f"No such {principal_type}.")
    return namespace, target
