"""Who an MCP tool runs as, and what its writes record as their ``context``.

The server runs as an API token's user: ``manage.py mcp`` reads the key from
the environment once, ``/mcp`` from each request's ``Authorization`` header.
Either way the key is checked by the API's own authentication
(:class:`atlas.api.auth.TokenAuthentication`), and the read tools send it on
with every in-process API call, so a revoked token stops working mid-session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import uuid6
from django.contrib.auth.models import User
from django.http import HttpRequest
from rest_framework.exceptions import AuthenticationFailed

from atlas.api.auth import TokenAuthentication
from atlas.api.provenance import request_context
from atlas.exceptions import NotAuthenticated
from atlas.models import ApiToken
from changesets import provenance

# An MCP client names itself in ``initialize`` (``clientInfo.name``); this much is kept.
MAX_CLIENT_NAME = 100
UNKNOWN_CLIENT = "unknown"


@dataclass(frozen=True)
class Caller:
    """The principal of one tool call.

    ``key`` is the raw API key, kept in memory only: in-process API reads
    authenticate with it exactly as an HTTP request would. ``request`` is the
    ``/mcp`` HTTP request (its request id and client address go into a write's
    context); None over stdio. ``stdio`` marks the long-lived process, whose
    database connection is checked between calls.
    """

    user: User
    token: ApiToken
    key: str
    client: str = UNKNOWN_CLIENT
    request: HttpRequest | None = None
    stdio: bool = False


def client_name(value: Any) -> str:
    """A client's self-declared name, as a changeset's context may hold it."""
    if not isinstance(value, str) or not value.strip():
        return UNKNOWN_CLIENT
    return value.replace("\x00", "").strip()[:MAX_CLIENT_NAME] or UNKNOWN_CLIENT


def authenticate(key: str) -> tuple[User, ApiToken]:
    """The user and token of ``key``, by the API's own token check, or :class:`NotAuthenticated`."""
    try:
        user, token = TokenAuthentication().authenticate_credentials(key)
    except AuthenticationFailed as exc:
        raise NotAuthenticated(str(exc.detail)) from exc
    return user, token


def write_context(caller: Caller) -> dict[str, Any]:
    """The ``context`` an MCP write records (API.md "Provenance", ``auth: "mcp"``).

    Over HTTP it is the request's context (request id, client address, user
    agent) as every API write records it; over stdio there is no request, so
    a fresh request id stands for the call. Then ``auth`` says the write came
    through MCP, ``token_id`` names the token (never the key) and ``client``
    the MCP client that asked.
    """
    if caller.request is not None:
        context = request_context(caller.request)
    else:
        context = {"request_id": str(uuid6.uuid7())}
    context.update(auth=provenance.AUTH_MCP, token_id=caller.token.pk, client=caller.client)
    return context
