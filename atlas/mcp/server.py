"""The Atlas MCP server: tools and resources on the official SDK's ``FastMCP``.

Every tool is a thin wrapper: a read is one API ``GET`` answered in process
by the API's view (:mod:`atlas.mcp.reads`), a write is one write service
behind a dry run and its ``plan_token`` (:mod:`atlas.mcp.writes`). Inputs are
JSON Schema (from the signatures); outputs are structured, with a schema
naming the fields the API documents (:mod:`atlas.mcp.schema`). An Atlas error
becomes a tool error whose text is the problem+json the API would have
answered (:mod:`atlas.mcp.bridge`, which also runs each tool's body on
Django's thread as its caller).

This module only assembles the server, one room per job:

1. the read tools (:mod:`atlas.mcp.read_tools`),
2. the mutating tools (:mod:`atlas.mcp.write_tools`),
3. the resources (:mod:`atlas.mcp.resources`).

The transports serve what it builds: ``manage.py mcp`` over stdio, and
``/mcp`` (:mod:`atlas.mcp.http`) over streamable HTTP.
"""

from __future__ import annotations

from mcp.server.fastmcp import FastMCP

from atlas.mcp import read_tools, resources, write_tools
from atlas.mcp.bridge import AtlasMCP
from atlas.mcp.caller import Caller

SERVER_NAME = "atlas"
INSTRUCTIONS = (
    "Atlas records every write to its JSON entity store as a changeset: who, when, what"
    " it looked like before. Find changes with list_changesets and get_entity_history,"
    " inspect them with get_changeset, blame_entity and diff_entity, read any past state"
    " with as_of. Mutating tools (write_entities, revert_changeset, restore_entity) only"
    " dry-run unless given the plan_token their own dry run returned; review the plan first."
)


def build_server(*, caller: Caller | None = None) -> FastMCP:
    """The server. ``caller`` is who it runs as over stdio (or in process);
    under ``/mcp`` each request brings its own caller in the ASGI scope."""
    mcp = AtlasMCP(SERVER_NAME, instructions=INSTRUCTIONS, caller=caller)
    read_tools.register(mcp)
    write_tools.register(mcp)
    resources.register(mcp)
    return mcp
