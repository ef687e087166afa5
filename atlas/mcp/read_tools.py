"""The read tools: each is one API ``GET`` (:mod:`atlas.mcp.reads`), in process.

A tool's signature is its input schema (FastMCP builds the JSON Schema from
it, with the help texts of :mod:`atlas.mcp.schema`); its body names the API
read and the query it sends, nothing more: parsing, paging, ``as_of``, the
branch and "not visible = not found" are the API view's.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp import types
from mcp.server.fastmcp import Context, FastMCP
from pydantic import Field

from atlas.mcp import reads
from atlas.mcp.bridge import caller_of, run_in_django
from atlas.mcp.reads import api_get
from atlas.mcp.schema import (
    AS_OF_HELP,
    AS_OF_TIME_HELP,
    BRANCH_HELP,
    PAGE_SIZE_HELP,
    PAGE_TOKEN_HELP,
    BlameOut,
    ChangesetOut,
    DiffOut,
    EntityOut,
    Page,
)

READ_ONLY = types.ToolAnnotations(readOnlyHint=True, openWorldHint=False)


async def list_changesets(
    ctx: Context,
    namespace: str | None = None,
    author: str | None = None,
    rpc: str | None = None,
    since: Annotated[str | None, Field(description="RFC 3339: at >= since")] = None,
    until: Annotated[str | None, Field(description="RFC 3339: at <= until")] = None,
    branch: Annotated[
        str | None, Field(description='Absent: all visible; "": baseline; else that branch')
    ] = None,
    page_size: Annotated[int | None, Field(description=PAGE_SIZE_HELP)] = None,
    page_token: Annotated[str | None, Field(description=PAGE_TOKEN_HELP)] = None,
) -> Page:
    """Changesets newest first, filtered as GET /api/v1/changesets (at most 100 ops each)."""
    who = caller_of(ctx)
    params = {
        "namespace": namespace,
        "author": author,
        "rpc": rpc,
        "since": since,
        "until": until,
        "branch": branch,
        "page_size": page_size,
        "page_token": page_token,
    }
    body = await run_in_django(who, lambda: api_get(who, reads.path("changesets"), params))
    return Page.model_validate(body)


async def get_changeset(
    ctx: Context,
    changeset_id: str,
    page_size: Annotated[int | None, Field(description=PAGE_SIZE_HELP)] = None,
    page_token: Annotated[str | None, Field(description=PAGE_TOKEN_HELP)] = None,
) -> ChangesetOut:
    """One changeset with its revision rows (before/after images), paged, in op order."""
    who = caller_of(ctx)

    def work() -> dict[str, Any]:
        detail = api_get(who, reads.path("changesets", changeset_id), {"page_size": 1})
        detail.pop("ops", None)
        detail.pop("ops_next_page_token", None)
        page = api_get(
            who,
            reads.path("changesets", changeset_id, "revisions"),
            {"page_size": page_size, "page_token": page_token},
        )
        return {
            **detail,
            "revisions": page["results"],
            "next_page_token": page["next_page_token"],
        }

    return ChangesetOut.model_validate(await run_in_django(who, work))


async def get_entity(
    ctx: Context,
    namespace: str,
    kind: str,
    slug: str,
    as_of: Annotated[str | None, Field(description=AS_OF_HELP)] = None,
    as_of_time: Annotated[str | None, Field(description=AS_OF_TIME_HELP)] = None,
    branch: Annotated[str, Field(description=BRANCH_HELP)] = "",
) -> EntityOut:
    """One entity now, or as it was at a changeset (as_of) or a time (as_of_time)."""
    who = caller_of(ctx)
    params = {"as_of": as_of, "as_of_time": as_of_time}
    url = reads.path("entities", namespace, kind, slug)
    body = await run_in_django(who, lambda: api_get(who, url, params, branch=branch))
    return EntityOut.model_validate(body)


async def list_entities(
    ctx: Context,
    namespace: str | None = None,
    kind: str | None = None,
    slug_prefix: str | None = None,
    as_of: Annotated[str | None, Field(description=AS_OF_HELP)] = None,
    as_of_time: Annotated[str | None, Field(description=AS_OF_TIME_HELP)] = None,
    branch: Annotated[str, Field(description=BRANCH_HELP)] = "",
    page_size: Annotated[int | None, Field(description=PAGE_SIZE_HELP)] = None,
    page_token: Annotated[str | None, Field(description=PAGE_TOKEN_HELP)] = None,
) -> Page:
    """Entities in (namespace, kind, slug) order, now or at a past point."""
    who = caller_of(ctx)
    params = {
        "namespace": namespace,
        "kind": kind,
        "slug_prefix": slug_prefix,
        "as_of": as_of,
        "as_of_time": as_of_time,
        "page_size": page_size,
        "page_token": page_token,
    }
    url = reads.path("entities")
    body = await run_in_django(who, lambda: api_get(who, url, params, branch=branch))
    return Page.model_validate(body)


async def get_entity_history(
    ctx: Context,
    namespace: str,
    kind: str,
    slug: str,
    key: Annotated[
        str | None, Field(description="RFC 6901 pointer: only revisions that changed it")
    ] = None,
    branch: Annotated[str, Field(description=BRANCH_HELP)] = "",
    page_size: Annotated[int | None, Field(description=PAGE_SIZE_HELP)] = None,
    page_token: Annotated[str | None, Field(description=PAGE_TOKEN_HELP)] = None,
) -> Page:
    """An entity's revisions newest first (works after delete), optionally for one key."""
    who = caller_of(ctx)
    params = {"key": key, "page_size": page_size, "page_token": page_token}
    url = reads.path("entities", namespace, kind, slug, "history")
    body = await run_in_django(who, lambda: api_get(who, url, params, branch=branch))
    return Page.model_validate(body)


async def blame_entity(
    ctx: Context,
    namespace: str,
    kind: str,
    slug: str,
    as_of: Annotated[str | None, Field(description=AS_OF_HELP)] = None,
    as_of_time: Annotated[str | None, Field(description=AS_OF_TIME_HELP)] = None,
    branch: Annotated[str, Field(description=BRANCH_HELP)] = "",
) -> BlameOut:
    """For every leaf of the entity's content, the changeset that last set it."""
    who = caller_of(ctx)
    params = {"as_of": as_of, "as_of_time": as_of_time}
    url = reads.path("entities", namespace, kind, slug, "blame")
    body = await run_in_django(who, lambda: api_get(who, url, params, branch=branch))
    return BlameOut.model_validate(body)


async def diff_entity(
    ctx: Context,
    namespace: str,
    kind: str,
    slug: str,
    from_changeset: Annotated[str | None, Field(description="A changeset id")] = None,
    from_time: Annotated[str | None, Field(description="RFC 3339")] = None,
    to_changeset: Annotated[str | None, Field(description="A changeset id; absent: now")] = None,
    to_time: Annotated[str | None, Field(description="RFC 3339")] = None,
    branch: Annotated[str, Field(description=BRANCH_HELP)] = "",
) -> DiffOut:
    """The entity between two points: both images and an RFC 6902 patch."""
    who = caller_of(ctx)
    params = {
        "from": from_changeset,
        "from_time": from_time,
        "to": to_changeset,
        "to_time": to_time,
    }
    url = reads.path("entities", namespace, kind, slug, "diff")
    body = await run_in_django(who, lambda: api_get(who, url, params, branch=branch))
    return DiffOut.model_validate(body)


# In the order clients list them.
TOOLS = (
    list_changesets,
    get_changeset,
    get_entity,
    list_entities,
    get_entity_history,
    blame_entity,
    diff_entity,
)


def register(mcp: FastMCP) -> None:
    """Add the read tools to ``mcp``, marked read-only and closed-world."""
    for tool in TOOLS:
        mcp.tool(annotations=READ_ONLY)(tool)
