"""Reads of namespaces and grants."""

from __future__ import annotations

from django.db.models import QuerySet

from entities import access
from entities.models import Namespace
from entities.validation import is_valid_namespace


def namespace_list(*, user: access.User) -> QuerySet[Namespace]:
    """Namespaces the user can read, by name."""
    readable = access.readable_namespaces(user)
    qs = Namespace.objects.order_by("name")
    return qs if readable is None else qs.filter(name__in=readable)


def namespace_get(*, name: str) -> Namespace | None:
    """The namespace called ``name``; None for a name no namespace can have."""
    if not is_valid_namespace(name):
        return None
    return Namespace.objects.filter(name=name).first()
