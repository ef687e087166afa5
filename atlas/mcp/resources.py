"""Entities and changesets as MCP resources; listing pages through visible entities.

Registered on the SDK's low-level server (FastMCP's own templates match
path segments only, and ``?as_of=`` is a query). Reading one is the same
API read as ``get_entity`` / the changeset detail, so an invisible one is
"not found" here too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from mcp import types
from mcp.server.fastmcp import FastMCP
from mcp.server.lowlevel.helper_types import ReadResourceContents
from pydantic import AnyUrl

from atlas.mcp import reads
from atlas.mcp.bridge import caller_of, run_in_django
from atlas.mcp.reads import api_get

ENTITY_TEMPLATE = "atlas://{namespace}/{kind}/{slug}"
CHANGESET_TEMPLATE = "atlas://changesets/{id}"
MAX_RESOURCES_PER_PAGE = 100

TEMPLATES = [
    types.ResourceTemplate(
        uriTemplate=ENTITY_TEMPLATE + "{?as_of}",
        name="entity",
        description="An entity as the API shows it; ?as_of=<changeset id>: in the past.",
        mimeType="application/json",
    ),
    types.ResourceTemplate(
        uriTemplate=CHANGESET_TEMPLATE,
        name="changeset",
        description="A changeset with the first page of its ops.",
        mimeType="application/json",
    ),
]


def entity_uri(entity: dict[str, Any]) -> str:
    return f"atlas://{entity['namespace']}/{entity['kind']}/{entity['slug']}"


def register(mcp: FastMCP) -> None:
    """Add the resource handlers to ``mcp``'s low-level server."""
    low = mcp._mcp_server

    @low.list_resources()
    async def list_resources(request: types.ListResourcesRequest) -> types.ListResourcesResult:
        who = caller_of(mcp.get_context())
        cursor = request.params.cursor if request.params else None
        params = {"page_size": MAX_RESOURCES_PER_PAGE, "page_token": cursor}
        body = await run_in_django(who, lambda: api_get(who, reads.path("entities"), params))
        resources = [
            types.Resource(
                uri=AnyUrl(entity_uri(e)),
                name=f"{e['namespace']}/{e['kind']}/{e['slug']}",
                description=f"version {e['version']}",
                mimeType="application/json",
            )
            for e in body["results"]
        ]
        return types.ListResourcesResult(resources=resources, nextCursor=body["next_page_token"])

    @low.list_resource_templates()
    async def list_resource_templates() -> list[types.ResourceTemplate]:
        return list(TEMPLATES)

    @low.read_resource()
    async def read_resource(uri: AnyUrl) -> Iterable[ReadResourceContents]:
        who = caller_of(mcp.get_context())
        url, params = _resource_read(str(uri))
        body = await run_in_django(who, lambda: api_get(who, url, params))
        return [ReadResourceContents(json.dumps(body, ensure_ascii=False), "application/json")]


def _resource_read(uri: str) -> tuple[str, dict[str, Any]]:
    """The API read behind a resource URI (a ``ValueError`` names a URI we do not serve)."""
    parts = urlsplit(uri)
    segments = [parts.netloc, *parts.path.strip("/").split("/")] if parts.path else [parts.netloc]
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    if parts.scheme != "atlas" or parts.fragment:
        raise ValueError(f"Unknown resource: {uri}")
    if len(segments) == 2 and segments[0] == "changesets" and not query:
        return reads.path("changesets", segments[1]), {}
    if len(segments) == 3 and set(query) <= {"as_of"}:
        return reads.path("entities", *segments), query
    raise ValueError(f"Unknown resource: {uri}")
