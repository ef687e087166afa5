"""Make an API token for a user and print its key, once.

    manage.py create_token <username> [--name NAME]
    TOKEN=$(manage.py create_token alice --name ci)

The key goes to standard output alone (so a script can capture it); only
its SHA-256 digest is stored, so it cannot be shown again. A user may have
several tokens; revoke one in the admin (API tokens, superusers only).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from atlas.exceptions import AtlasError
from atlas.services import api_token_create


class Command(BaseCommand):
    help = "Create an API token for a user and print its key (shown only this once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="a label to tell the user's tokens apart")

    def handle(self, *args: Any, username: str, name: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive: its tokens would be refused")
        try:
            token, key = api_token_create(user=user, name=name)
        except AtlasError as exc:
            raise CommandError(exc.detail) from exc
        self.stderr.write(
            f"Token {token.prefix}… for {username!r} created; its key is shown only now:"
        )
        self.stdout.write(key)
