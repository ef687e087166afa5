"""``/mcp``: the MCP streamable HTTP transport, served by Django under gunicorn.

Atlas is a WSGI application (gunicorn's threads, ``atlas.wsgi``), and the
SDK's transport is an ASGI application. This view bridges one request:

1. Authenticate ``Authorization: Token <key>`` with the API's own token
   check (401 problem+json otherwise, like the API).
2. Hand the request to the SDK's ``StreamableHTTPSessionManager`` in its
   *stateless, JSON-response* mode (``async_to_sync``: an event loop for the
   request's duration). Each POST carries one JSON-RPC message and gets one
   JSON answer; there is no server push, so ``GET`` (an SSE stream) and
   ``DELETE`` answer 405, which the spec allows and clients handle. Tool
   bodies run back on this thread (``sync_to_async(thread_sensitive=True)``),
   so the ORM sees an ordinary request thread.
3. Stateless means any gunicorn worker may answer any request, yet a write
   must record the client's name, which only ``initialize`` says. So the
   answer to ``initialize`` carries an ``Mcp-Session-Id`` that is the name,
   signed and bound to the token's user; clients send it back on every
   request (the spec requires it), and no server keeps session state. A
   session id that is altered or another user's is 404 (the spec's
   "re-initialize"); a request without one is 400.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from functools import cache
from typing import Any

from asgiref.sync import async_to_sync
from django.core import signing
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from mcp.server.fastmcp import FastMCP
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from atlas import conf
from atlas.api.errors import PROBLEM_JSON
from atlas.exceptions import AtlasError, BadRequest, NotAuthenticated, NotFound, PayloadTooLarge
from atlas.mcp.bridge import CALLER_SCOPE_KEY
from atlas.mcp.caller import UNKNOWN_CLIENT, Caller, authenticate, client_name
from atlas.mcp.server import build_server

_SESSION_SALT = "atlas.mcp.session"
MSG_NO_TOKEN = "Send Authorization: Token <key> (an Atlas API token) with every request."
MSG_NO_SESSION = "Missing Mcp-Session-Id: send the one the initialize answer gave."
MSG_BAD_SESSION = "Invalid or expired session ID: initialize again."


@cache
def _server() -> FastMCP:
    """One server per process: it holds only the tool definitions."""
    return build_server()


def _problem(error: AtlasError, request: HttpRequest) -> JsonResponse:
    body = {**error.as_problem(), "instance": request.get_full_path()}
    response = JsonResponse(body, status=error.status, content_type=PROBLEM_JSON)
    if error.status == 401:
        response["WWW-Authenticate"] = "Token"
    return response


def _key(request: HttpRequest) -> str:
    raw = request.META.get("HTTP_AUTHORIZATION", "")
    parts = (raw.encode("latin-1") if isinstance(raw, str) else raw).split()
    if len(parts) != 2 or parts[0].lower() != b"token":
        raise NotAuthenticated(MSG_NO_TOKEN)
    try:
        return parts[1].decode()
    except UnicodeError:
        raise NotAuthenticated(MSG_NO_TOKEN) from None


def session_id(*, user_pk: int, client: str) -> str:
    return signing.dumps({"u": user_pk, "c": client}, salt=_SESSION_SALT, compress=True)


def _initialize_client(body: bytes) -> str | None:
    """The client's name if ``body`` is an ``initialize`` request, else None."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    params = message.get("params")
    info = params.get("clientInfo") if isinstance(params, dict) else None
    return client_name(info.get("name") if isinstance(info, dict) else None)


def _session_client(request: HttpRequest, user_pk: int) -> str:
    sid = request.headers.get(MCP_SESSION_ID_HEADER)
    if not sid:
        raise BadRequest(MSG_NO_SESSION, pointer=f"/headers/{MCP_SESSION_ID_HEADER}")
    try:
        data = signing.loads(sid, salt=_SESSION_SALT)
    except signing.BadSignature:
        raise NotFound(MSG_BAD_SESSION) from None
    if not isinstance(data, dict) or data.get("u") != user_pk:
        raise NotFound(MSG_BAD_SESSION)
    return client_name(data.get("c"))


def _body(request: HttpRequest) -> bytes:
    limit = conf.get("ATLAS_MAX_BODY_BYTES")
    if int(request.META.get("CONTENT_LENGTH") or 0) > limit:
        raise PayloadTooLarge(f"The body is over {limit} bytes.")
    return request.body


def _scope(request: HttpRequest, caller: Caller) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.META.get("QUERY_STRING", "").encode("latin-1"),
        "headers": [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in request.headers.items()
        ],
        "client": (request.META.get("REMOTE_ADDR", ""), 0),
        "server": (request.get_host(), 0),
        CALLER_SCOPE_KEY: caller,
    }


async def _serve(
    scope: dict[str, Any], body: bytes
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Run the SDK's stateless JSON-response transport on one request; its answer."""
    manager = StreamableHTTPSessionManager(
        app=_server()._mcp_server,
        json_response=True,
        stateless=True,
        # Django checks Host (ALLOWED_HOSTS); a token, not a cookie, authenticates.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    sent = False
    status, headers, chunks = 500, [], []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    async with manager.run():
        await manager.handle_request(scope, receive, send)
    return status, headers, b"".join(chunks)


@csrf_exempt
def mcp_endpoint(request: HttpRequest) -> HttpResponse:
    """``/mcp``: one MCP message per POST, as the token's user (see the module docstring)."""
    try:
        key = _key(request)
        user, token = authenticate(key)
        body = _body(request) if request.method == "POST" else b""
        client = _initialize_client(body) if body else None
        initializing = client is not None
        if client is None and request.method == "POST":
            client = _session_client(request, user.pk)
    except AtlasError as error:
        return _problem(error, request)
    caller = Caller(user, token, key, client or UNKNOWN_CLIENT, request)
    status, headers, content = async_to_sync(_serve)(_scope(request, caller), body)
    response = HttpResponse(content, status=status)
    for name, value in headers:
        if name.lower() != b"content-length":
            response[name.decode("latin-1")] = value.decode("latin-1")
    if initializing and status == 200:
        response[MCP_SESSION_ID_HEADER] = session_id(user_pk=user.pk, client=client or "")
    return response
