"""Serve the Atlas MCP server over stdio, as an API token's user.

    ATLAS_MCP_TOKEN=atlas_... manage.py mcp --token-env ATLAS_MCP_TOKEN

An MCP client (Claude Desktop, an agent framework) starts this command and
speaks JSON-RPC on its standard input and output; logs go to standard
error. The key is read from the named environment variable (never from
the command line, where ``ps`` would show it), checked once at start, and
then sent with every in-process API read, so a revoked token stops working
mid-session. Tools, resources and the confirm step: docs/mcp.md.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from atlas.exceptions import NotAuthenticated
from atlas.mcp.caller import Caller, authenticate
from atlas.mcp.server import build_server

DEFAULT_TOKEN_ENV = "ATLAS_MCP_TOKEN"


class Command(BaseCommand):
    help = "Serve the Atlas MCP server over stdio as the user of an API token (docs/mcp.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--token-env",
            default=DEFAULT_TOKEN_ENV,
            help=f"environment variable holding the API token's key (default {DEFAULT_TOKEN_ENV})",
        )

    def handle(self, *args: Any, token_env: str, **options: Any) -> None:
        key = os.environ.get(token_env, "").strip()
        if not key:
            raise CommandError(f"set {token_env} to an Atlas API token's key")
        try:
            user, token = authenticate(key)
        except NotAuthenticated as exc:
            raise CommandError(f"{token_env}: {exc.detail}") from exc
        self.stderr.write(f"Atlas MCP server on stdio as {user.username!r}")
        build_server(caller=Caller(user, token, key, stdio=True)).run("stdio")
