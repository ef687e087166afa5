"""Namespaces and role grants: reads for everyone; namespaces are managed by
superusers, a namespace's grants also by its maintainers."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from atlas.api import paging
from atlas.api.idempotency import idempotent
from atlas.api.render import rfc3339
from atlas.exceptions import NotFound, PermissionDenied
from entities import access, services
from entities.api.serializers import Errors, check_fields, namespace_field, require_object
from entities.api.views import PAGE_PARAMS
from entities.models import Namespace
from entities.selectors import namespace_list
from entities.validation import MSG_NAMESPACE, is_valid_namespace

PROBLEM = OpenApiTypes.OBJECT


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


class NamespaceListView(APIView):
    permission_classes = [IsSuperuserForWrites]

    @extend_schema(
        operation_id="namespaces_list",
        summary="Namespaces you can read",
        parameters=PAGE_PARAMS,
        responses={
            200: inline_serializer(
                "NamespacePage",
                {
                    "results": NamespaceSerializer.__class__(many=True),
                    "next_page_token": serializers.CharField(allow_null=True),
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        limit = paging.page_size(request)
        position = paging.page_position("namespaces", request)
        qs = namespace_list(user=request.user)
        if position is not None:
            after = position.get("n")
            if not isinstance(after, str):
                raise paging.BadRequest("The page token is invalid.", pointer="/page_token")
            qs = qs.filter(name__gt=after)
        rows = list(qs[: limit + 1])
        token = None
        if len(rows) > limit:
            rows = rows[:limit]
            token = paging.encode_token("namespaces", request, {"n": rows[-1].name})
        return Response({"results": [namespace_repr(n) for n in rows], "next_page_token": token})

    @extend_schema(
        operation_id="namespaces_create",
        summary="Create a namespace (superusers)",
        request=inline_serializer(
            "NamespaceCreate",
            {"name": namespace_field(), "protected": serializers.BooleanField(default=False)},
        ),
        responses={201: NamespaceSerializer, 403: PROBLEM, 409: PROBLEM, 422: PROBLEM},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        body = require_object(request.data)
        errors = Errors()
        check_fields(body, errors, "", required={"name"}, optional={"protected"})
        if "name" in body and not is_valid_namespace(body["name"]):
            errors.add("/name", MSG_NAMESPACE)
        protected = body.get("protected", False)
        if not isinstance(protected, bool):
            errors.add("/protected", "Must be true or false.")
        errors.raise_if_any()
        namespace = services.namespace_create(name=body["name"], protected=protected)
        return Response(namespace_repr(namespace), status=201)


class NamespaceDetailView(APIView):
    """One namespace. Not readable = 404 first, so a PATCH confirms nothing hidden."""

    def _get(self, request: Request, name: str) -> Namespace:
        namespace = (
            Namespace.objects.filter(name=name).first() if is_valid_namespace(name) else None
        )
        if namespace is None or not access.can_read(request.user, name):
            raise NotFound("No such namespace.")
        return namespace

    @extend_schema(
        operation_id="namespaces_get", responses={200: NamespaceSerializer, 404: PROBLEM}
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(namespace_repr(self._get(request, name)))

    @extend_schema(
        operation_id="namespaces_update",
        summary="Change a namespace's protection (superusers)",
        request=inline_serializer("NamespaceUpdate", {"protected": serializers.BooleanField()}),
        responses={200: NamespaceSerializer, 403: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    @idempotent
    def patch(self, request: Request, name: str) -> Response:
        self._get(request, name)
        if not access.is_superuser(request.user):
            raise PermissionDenied("Managing namespaces needs a superuser.")
        body = require_object(request.data)
        errors = Errors()
        check_fields(body, errors, "", required={"protected"}, optional=set())
        if "protected" in body and not isinstance(body["protected"], bool):
            errors.add("/protected", "Must be true or false.")
        errors.raise_if_any()
        namespace = services.namespace_update(name=name, protected=body["protected"])
        return Response(namespace_repr(namespace))


class GrantView(APIView):
    """A namespace's grants: superusers and that namespace's maintainers manage them.

    A caller who cannot read the namespace gets 404 (not visible = not found);
    a reader or writer gets 403.
    """

    def _resolve(
        self, request: Request, name: str, principal_type: str, principal: str
    ) -> tuple[Namespace, Any]:
        namespace = (
            Namespace.objects.filter(name=name).first() if is_valid_namespace(name) else None
        )
        if namespace is None or not access.can_read(request.user, name):
            raise NotFound("No such namespace.")
        if access.role_in(request.user, name) < access.Role.MAINTAINER:
            raise PermissionDenied(f"Managing grants in {name!r} needs the maintainer role there.")
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

    @extend_schema(
        operation_id="grants_put",
        summary="Grant a role to a user or group (superusers, maintainers)",
        request=inline_serializer(
            "GrantBody", {"role": serializers.ChoiceField(["reader", "writer", "maintainer"])}
        ),
        responses={
            200: GrantSerializer,
            201: GrantSerializer,
            403: PROBLEM,
            404: PROBLEM,
            422: PROBLEM,
        },
    )
    @idempotent
    def put(self, request: Request, name: str, principal_type: str, principal: str) -> Response:
        namespace, target = self._resolve(request, name, principal_type, principal)
        body = require_object(request.data)
        errors = Errors()
        check_fields(body, errors, "", required={"role"}, optional=set())
        if "role" in body and body["role"] not in services.ROLE_NAMES:
            errors.add("/role", "One of reader, writer, maintainer.")
        errors.raise_if_any()
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
        summary="Revoke a user's or group's role (superusers, maintainers)",
        responses={204: None, 403: PROBLEM, 404: PROBLEM},
    )
    @idempotent
    def delete(self, request: Request, name: str, principal_type: str, principal: str) -> Response:
        namespace, target = self._resolve(request, name, principal_type, principal)
        services.role_revoke(namespace=namespace, principal=target)
        return Response(status=204)
