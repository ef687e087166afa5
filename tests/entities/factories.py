"""Factories for users and namespaces. Entities are never built by a factory:
they are written through the write service, like everything else (invariant 1).
"""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from entities.models import Namespace


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    is_staff = False
    is_superuser = False


class StaffFactory(UserFactory):
    """May log in to the admin; holds no namespace role without grants."""

    username = factory.Sequence(lambda n: f"staff{n}")
    is_staff = True


class SuperuserFactory(UserFactory):
    """Every role in every namespace (the only principal above the grants)."""

    username = factory.Sequence(lambda n: f"root{n}")
    is_staff = True
    is_superuser = True


class GroupFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Group
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"group{n}")


class NamespaceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Namespace
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"ns{n}.test")
    protected = False
