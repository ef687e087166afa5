"""Read tools, answered by the API's own views, in process.

A read tool is one ``GET`` of ``/api/v1`` made without a network hop: the
request is built here, routed by Django's resolver to the view the HTTP API
serves, and authenticated there by the caller's token like any request. So
parsing and its 422s, the branch, ``as_of``, paging tokens, the role checks
("not visible = not found") and the representations are the API's, by
construction: there is no second implementation to drift from it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from django.core.handlers.wsgi import WSGIRequest
from django.urls import Resolver404, resolve

from atlas.api.branch import BRANCH_HEADER
from atlas.api.renderers import JSONRenderer
from atlas.mcp.caller import Caller

API_ROOT = "/api/v1"


class ApiProblem(Exception):
    """An API answer of 400 or more: ``problem`` is its problem+json body."""

    def __init__(self, problem: dict[str, Any]) -> None:
        super().__init__(json.dumps(problem, ensure_ascii=False))
        self.problem = problem


def path(*segments: str) -> str:
    """An API path from segments, each percent-encoded (a slug is never a path)."""
    return "/".join([API_ROOT, *(quote(s, safe="") for s in segments)])


def _request(caller: Caller, url: str, query: str, branch: str) -> WSGIRequest:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": url,
        "SCRIPT_NAME": "",
        "QUERY_STRING": query,
        "SERVER_NAME": "mcp.internal",
        "SERVER_PORT": "0",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "",
        "HTTP_AUTHORIZATION": f"Token {caller.key}",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.url_scheme": "http",
    }
    if caller.request is not None:
        environ["REMOTE_ADDR"] = caller.request.META.get("REMOTE_ADDR", "")
    if branch:
        environ["HTTP_" + BRANCH_HEADER.upper().replace("-", "_")] = branch
    return WSGIRequest(environ)


def api_get(
    caller: Caller, url: str, params: Mapping[str, Any] | None = None, *, branch: str = ""
) -> dict[str, Any]:
    """``GET url?params`` through the API's view, as ``caller``; the JSON body.

    ``None`` values are left out (absent, as the API means it); the answer is
    the JSON the API would send. An error answer raises :class:`ApiProblem`.
    """
    query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
    try:
        match = resolve(url)
    except Resolver404:
        raise ApiProblem(
            {"type": "https://atlas.dev/problems/not-found", "title": "Not found", "status": 404}
        ) from None
    response = match.func(_request(caller, url, query, branch), *match.args, **match.kwargs)
    body = json.loads(JSONRenderer().render(response.data)) if response.data is not None else {}
    if response.status_code >= 400:
        raise ApiProblem(body)
    return body
