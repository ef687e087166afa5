"""Writes of the cross-cutting app: API tokens."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import transaction

from atlas.exceptions import ValidationFailed
from atlas.models import ApiToken
from atlas.tokens import generate_key, key_digest, key_prefix

MSG_TOKEN_NAME_TOO_LONG = "A token name has at most 100 characters."
MSG_TOKEN_KEY_INVALID = "A token key is 32 to 200 printable characters without spaces."


@transaction.atomic
def api_token_create(*, user: User, name: str = "", key: str | None = None) -> tuple[ApiToken, str]:
    """Make an API token for ``user``; returns it and its key, which is never stored.

    The caller shows the key once (``manage.py create_token``, the admin's
    add page). ``key`` is for keys made elsewhere (the demo user's stable key,
    ``atlas_demo``); without it a random one is generated.
    """
    if len(name) > 100:
        raise ValidationFailed(MSG_TOKEN_NAME_TOO_LONG, pointer="/name")
    if key is None:
        key = generate_key()
    elif not (32 <= len(key) <= 200 and key.isprintable() and not any(c.isspace() for c in key)):
        raise ValidationFailed(MSG_TOKEN_KEY_INVALID, pointer="/key")
    token = ApiToken.objects.create(
        user=user, name=name, prefix=key_prefix(key), digest=key_digest(key)
    )
    return token, key


@transaction.atomic
def api_token_revoke(*, token: ApiToken) -> None:
    """Revoke a token: requests carrying its key are refused from now on."""
    ApiToken.objects.filter(pk=token.pk).delete()
