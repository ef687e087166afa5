"""The development-only author header (DESIGN invariant 5's one exception)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from changesets.principals import SYSTEM_USERNAME
from entities.validation import SLUG_RE

HEADER = "X-Atlas-Author"


class DevAuthorHeaderAuthentication(BaseAuthentication):
    """With ``ATLAS_DEV_AUTHOR_HEADER`` on, ``X-Atlas-Author`` names the principal.

    Listed after token and session authentication, so it is consulted only
    when nobody is authenticated. The user is created on first use with no
    roles; grant it roles like any other user. Off by default, and it must
    stay off in production: anyone could claim any name.
    """

    def authenticate(self, request: Request) -> tuple[Any, None] | None:
        if not settings.ATLAS_DEV_AUTHOR_HEADER:
            return None
        name = request.headers.get(HEADER)
        if not name:
            return None
        if not SLUG_RE.fullmatch(name) or len(name) > 150:
            raise AuthenticationFailed(f"{HEADER} must be a plain user name.")
        if name == SYSTEM_USERNAME:
            # Reserved for operators' commands; creating it here would make it an active user.
            raise AuthenticationFailed(f"{HEADER} cannot name the system principal.")
        user, _ = get_user_model().objects.get_or_create(username=name)
        if not user.is_active:
            raise AuthenticationFailed("User inactive.")
        return user, None


class DevAuthorHeaderScheme(OpenApiAuthenticationExtension):
    """Describe the dev header in the schema (it exists only when the setting is on)."""

    target_class = "atlas.api.auth.DevAuthorHeaderAuthentication"
    name = "devAuthorHeader"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": HEADER,
            "description": "Development only (ATLAS_DEV_AUTHOR_HEADER); off by default.",
        }
