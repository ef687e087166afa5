"""How API requests are authenticated: hashed API tokens, and the
development-only author header (DESIGN invariant 5's one exception)."""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from atlas import conf
from atlas.models import ApiToken
from atlas.tokens import key_digest
from changesets.principals import SYSTEM_USERNAME
from entities.validation import SLUG_RE

HEADER = "X-Atlas-Author"
TOKEN_KEYWORD = "Token"
MSG_TOKEN_MISSING = "Invalid token header. No credentials provided."
MSG_TOKEN_SPACES = "Invalid token header. Token string should not contain spaces."
MSG_TOKEN_CHARACTERS = "Invalid token header. Token string should not contain invalid characters."
MSG_TOKEN_INVALID = "Invalid token."
MSG_USER_INACTIVE = "User inactive or deleted."


def actor(request: Request) -> User:
    """``request.user`` as the signed-in user a write is attributed to.

    DRF types ``request.user`` as ``User | AnonymousUser``; every view that
    writes runs behind ``IsAuthenticated`` (the default permission) or a
    stricter one, which refused anonymous requests before the handler ran, so
    only the type is narrowed here: no check, no behaviour.
    """
    return cast(User, request.user)


class TokenAuthentication(BaseAuthentication):
    """``Authorization: Token <key>`` against ``ApiToken`` (only digests are stored).

    Parses the header exactly like DRF's ``TokenAuthentication`` (same
    errors), so clients see no difference. One query per request: the
    digest's unique index, joined to the user. The lookup compares digests,
    not keys: how long it takes says something about a SHA-256 value, which
    does not help anyone build a key that hashes to it. ``request.auth`` is
    the ``ApiToken``.
    """

    keyword = TOKEN_KEYWORD

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        auth = get_authorization_header(request).split()
        if not auth or auth[0].lower() != self.keyword.lower().encode():
            return None
        if len(auth) == 1:
            raise AuthenticationFailed(MSG_TOKEN_MISSING)
        if len(auth) > 2:
            raise AuthenticationFailed(MSG_TOKEN_SPACES)
        try:
            key = auth[1].decode()
        except UnicodeError:
            raise AuthenticationFailed(MSG_TOKEN_CHARACTERS) from None
        return self.authenticate_credentials(key)

    def authenticate_credentials(self, key: str) -> tuple[Any, ApiToken]:
        token = ApiToken.objects.select_related("user").filter(digest=key_digest(key)).first()
        if token is None:
            raise AuthenticationFailed(MSG_TOKEN_INVALID)
        if not token.user.is_active:
            raise AuthenticationFailed(MSG_USER_INACTIVE)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class TokenScheme(OpenApiAuthenticationExtension):
    """Describe token authentication in the schema as DRF's own token auth was."""

    target_class = "atlas.api.auth.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'Token-based authentication with required prefix "Token"',
        }


class DevAuthorHeaderAuthentication(BaseAuthentication):
    """With ``ATLAS_DEV_AUTHOR_HEADER`` on, ``X-Atlas-Author`` names the principal.

    Listed after token and session authentication, so it is consulted only
    when nobody is authenticated. The user is created on first use with no
    roles; grant it roles like any other user. Off by default, and it must
    stay off in production: anyone could claim any name.
    """

    def authenticate(self, request: Request) -> tuple[Any, None] | None:
        if not conf.get("ATLAS_DEV_AUTHOR_HEADER"):
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
