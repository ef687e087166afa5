"""How a tool call reaches Django: as whom, on which thread, and its errors.

The SDK runs handlers on an event loop; Django's ORM is synchronous, so
each tool's body runs through ``sync_to_async(thread_sensitive=True)``:
under ``/mcp`` that is the request's own thread (and database connection),
over stdio one worker thread for the whole session.

The caller comes from one of two places. Under ``/mcp`` each request brings
its own, left in the ASGI scope by the view (:mod:`atlas.mcp.http`). Over
stdio (and in process) the server itself runs as one caller, which is why
the server is an :class:`AtlasMCP`: the tools are plain module functions,
and the context they are handed leads back to the server and its caller.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError

from atlas.api.errors import problem_for
from atlas.mcp.caller import Caller, client_name
from atlas.mcp.reads import ApiProblem

# Where the ``/mcp`` view leaves the request's caller in the ASGI scope.
CALLER_SCOPE_KEY = "atlas.mcp.caller"
MSG_NO_CALLER = "No caller: run the server with manage.py mcp or at /mcp."

T = TypeVar("T")


class AtlasMCP(FastMCP[Any]):
    """``FastMCP`` that knows whom it runs as when a request does not say.

    ``caller`` is the stdio (or in-process) principal; None under ``/mcp``,
    where every request carries its own.
    """

    def __init__(self, name: str, *, instructions: str, caller: Caller | None) -> None:
        super().__init__(name, instructions=instructions)
        self.caller = caller


def caller_of(ctx: Context) -> Caller:
    """Who this call runs as: the ``/mcp`` request's caller, else the server's own,
    named after the client that said so in ``initialize``."""
    request = ctx.request_context.request
    scoped = getattr(request, "scope", {}).get(CALLER_SCOPE_KEY) if request else None
    if isinstance(scoped, Caller):
        return scoped
    server = ctx.fastmcp
    caller = server.caller if isinstance(server, AtlasMCP) else None
    if caller is None:
        raise ToolError(MSG_NO_CALLER)
    params = ctx.session.client_params
    name = client_name(params.clientInfo.name if params is not None else None)
    return Caller(caller.user, caller.token, caller.key, name, None, caller.stdio)


def problem_text(exc: Exception) -> str | None:
    """The problem+json text of an Atlas or API error, None for anything else."""
    if isinstance(exc, ApiProblem):
        return json.dumps(exc.problem, ensure_ascii=False)
    error = problem_for(exc)
    return json.dumps(error.as_problem(), ensure_ascii=False) if error is not None else None


async def run_in_django(caller: Caller, work: Callable[[], T]) -> T:
    """``work`` on the ORM's thread; Atlas errors become tool errors (problem+json text)."""

    def call() -> T:
        if caller.stdio:
            close_old_connections()  # a long session outlives CONN_MAX_AGE
        try:
            return work()
        except Exception as exc:
            text = problem_text(exc)
            if text is None:
                raise
            raise ToolError(text) from exc

    return await sync_to_async(call, thread_sensitive=True)()
