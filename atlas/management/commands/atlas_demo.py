"""Make the demo superuser and its API token (idempotent) and say how to use them."""

from __future__ import annotations

import hmac
import os
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from atlas.models import ApiToken
from atlas.services import api_token_create
from atlas.tokens import KEY_PREFIX, key_digest

USERNAME = "demo"
DEFAULT_PASSWORD = "demo-password"
TOKEN_NAME = "make run (demo)"


def demo_key(username: str) -> str:
    """The demo user's key, derived from ``SECRET_KEY``: the same on every run.

    Only digests are stored, so a key cannot be read back to print it again;
    deriving it keeps the token ``make run`` prints stable across runs (scripts
    that pasted it keep working) without storing it. A new ``SECRET_KEY`` gives
    a new key, and the demo's old token is revoked.
    """
    mac = hmac.new(settings.SECRET_KEY.encode(), f"atlas-demo-token:{username}".encode(), "sha256")
    return KEY_PREFIX + mac.hexdigest()[:40]


def ensure_demo_token(user: Any) -> str:
    """Make sure the demo user's derived token exists (and no stale demo token); its key."""
    key = demo_key(user.get_username())
    digest = key_digest(key)
    ApiToken.objects.filter(user=user, name=TOKEN_NAME).exclude(digest=digest).delete()
    if not ApiToken.objects.filter(digest=digest).exists():
        api_token_create(user=user, name=TOKEN_NAME, key=key)
    return key


class Command(BaseCommand):
    help = "Create the `demo` superuser and its API token if missing, then print how to log in."

    def handle(self, *args: Any, **options: Any) -> None:
        password = os.environ.get("ATLAS_DEMO_PASSWORD", "")
        if not password:
            if not settings.DEBUG:
                raise CommandError("DEBUG is off: set ATLAS_DEMO_PASSWORD to use a demo user")
            password = DEFAULT_PASSWORD
        with transaction.atomic():
            user, created = get_user_model().objects.get_or_create(username=USERNAME)
            if created or not (user.is_staff and user.is_superuser and user.is_active):
                user.is_staff = user.is_superuser = user.is_active = True
                user.save(update_fields=["is_staff", "is_superuser", "is_active"])
            # Only on change: a new hash would log out the demo user's admin sessions.
            if not user.check_password(password):
                user.set_password(password)
                user.save(update_fields=["password"])
            key = ensure_demo_token(user)

        host = os.environ.get("HOST") or "127.0.0.1"
        if host in ("0.0.0.0", "::"):  # listening everywhere; show the loopback address
            host = "127.0.0.1"
        elif ":" in host and not host.startswith("["):
            host = f"[{host}]"
        base = f"http://{host}:{os.environ.get('PORT') or '8000'}"
        shown = password if password == DEFAULT_PASSWORD else "$ATLAS_DEMO_PASSWORD"
        lines = [
            "",
            f"Atlas demo user {USERNAME!r} {'created' if created else 'ready'}.",
            f"  admin     {base}/admin/  (user {USERNAME}, password {shown})",
            f"  API root  {base}/api/v1/",
            f"  API docs  {base}/api/docs/",
            f"  token     {key}",
            "Try:",
            f'  curl -H "Authorization: Token {key}" {base}/api/v1/namespaces',
            "",
        ]
        self.stdout.write("\n".join(lines))
