"""The Atlas MCP server: tools and resources on the official SDK's ``FastMCP``.

Every tool is a thin wrapper: a read is one API ``GET`` answered in process
by the API's view (:mod:`atlas.mcp.reads`), a write is one write service
behind a dry run and its ``plan_token`` (:mod:`atlas.mcp.writes`). Inputs are
JSON Schema (from the signatures); outputs are structured, with a schema
naming the fields the API documents (``extra`` members pass through as the
API sent them). An Atlas error becomes a tool error whose text is the
problem+json the API would have answered.

The SDK runs handlers on an event loop; Django's ORM is synchronous, so
each tool's body runs through ``sync_to_async(thread_sensitive=True)``:
under ``/mcp`` that is the request's own thread (and database connection),
over stdio one worker thread for the whole session.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from mcp import types
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.lowlevel.helper_types import ReadResourceContents
from pydantic import AnyUrl, BaseModel, ConfigDict, Field

from atlas.api.errors import problem_for
from atlas.mcp import reads, writes
from atlas.mcp.caller import Caller, client_name
from atlas.mcp.reads import ApiProblem, api_get

# Where the ``/mcp`` view leaves the request's caller in the ASGI scope.
CALLER_SCOPE_KEY = "atlas.mcp.caller"
SERVER_NAME = "atlas"
INSTRUCTIONS = (
    "Atlas records every write to its JSON entity store as a changeset: who, when, what"
    " it looked like before. Find changes with list_changesets and get_entity_history,"
    " inspect them with get_changeset, blame_entity and diff_entity, read any past state"
    " with as_of. Mutating tools (write_entities, revert_changeset, restore_entity) only"
    " dry-run unless given the plan_token their own dry run returned; review the plan first."
)
PAGE_SIZE_HELP = "Results per page (default 50, max 500)."
PAGE_TOKEN_HELP = "next_page_token of the previous page."
BRANCH_HELP = 'A branch name; "" (default) is baseline.'
AS_OF_HELP = "A changeset id: the state right after it landed (baseline only)."
AS_OF_TIME_HELP = "RFC 3339: the newest baseline changeset at or before it."
PLAN_TOKEN_HELP = "The plan_token of this tool's own dry run (same arguments): writes that plan."
MAX_RESOURCES_PER_PAGE = 100

T = TypeVar("T")


class _Open(BaseModel):
    """Outputs name what the API documents; anything else it sends passes through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Page(_Open):
    results: list[dict[str, Any]]
    next_page_token: str | None


class ChangesetOut(_Open):
    id: str
    seq: int
    author: str
    at: str
    branch: str
    rpc: str
    op_count_visible: int
    revisions: list[dict[str, Any]] = Field(description="Revision rows with before/after images")
    next_page_token: str | None = Field(description="Continues revisions")


class EntityOut(_Open):
    namespace: str
    kind: str
    slug: str
    content: dict[str, Any]
    version: int


class BlameOut(_Open):
    entity: dict[str, Any]
    keys: list[dict[str, Any]]


class DiffOut(_Open):
    from_: dict[str, Any] = Field(alias="from")
    to: dict[str, Any] | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    patch: list[dict[str, Any]]


class WriteOut(_Open):
    dry_run: bool
    plan_token: str | None = Field(
        description="Confirms this plan (dry runs that change something)"
    )
    changes: list[dict[str, Any]] = Field(description="Net change per entity: images and versions")
    changeset: dict[str, Any] | None = Field(
        description="The changeset written (null on a dry run)"
    )


def _problem_text(exc: Exception) -> str | None:
    """The problem+json text of an Atlas or API error, None for anything else."""
    if isinstance(exc, ApiProblem):
        return json.dumps(exc.problem, ensure_ascii=False)
    error = problem_for(exc)
    return json.dumps(error.as_problem(), ensure_ascii=False) if error is not None else None


async def _run(caller: Caller, work: Callable[[], T]) -> T:
    """``work`` on the ORM's thread; Atlas errors become tool errors (problem+json text)."""

    def call() -> T:
        if caller.stdio:
            close_old_connections()  # a long session outlives CONN_MAX_AGE
        try:
            return work()
        except Exception as exc:
            text = _problem_text(exc)
            if text is None:
                raise
            raise ToolError(text) from exc

    return await sync_to_async(call, thread_sensitive=True)()


def build_server(*, caller: Caller | None = None) -> FastMCP:
    """The server. ``caller`` is who it runs as over stdio (or in process);
    under ``/mcp`` each request brings its own caller in the ASGI scope."""
    mcp = FastMCP(SERVER_NAME, instructions=INSTRUCTIONS)

    def caller_of(ctx: Context) -> Caller:
        request = ctx.request_context.request
        scoped = getattr(request, "scope", {}).get(CALLER_SCOPE_KEY) if request else None
        if isinstance(scoped, Caller):
            return scoped
        if caller is None:
            raise ToolError("No caller: run the server with manage.py mcp or at /mcp.")
        params = ctx.session.client_params
        name = client_name(params.clientInfo.name if params is not None else None)
        return Caller(caller.user, caller.token, caller.key, name, None, caller.stdio)

    read_only = types.ToolAnnotations(readOnlyHint=True, openWorldHint=False)
    mutating = types.ToolAnnotations(
        readOnlyHint=False, destructiveHint=True, idempotentHint=False, openWorldHint=False
    )

    @mcp.tool(annotations=read_only)
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
        body = await _run(who, lambda: api_get(who, reads.path("changesets"), params))
        return Page.model_validate(body)

    @mcp.tool(annotations=read_only)
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

        return ChangesetOut.model_validate(await _run(who, work))

    @mcp.tool(annotations=read_only)
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
        body = await _run(who, lambda: api_get(who, url, params, branch=branch))
        return EntityOut.model_validate(body)

    @mcp.tool(annotations=read_only)
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
        body = await _run(who, lambda: api_get(who, reads.path("entities"), params, branch=branch))
        return Page.model_validate(body)

    @mcp.tool(annotations=read_only)
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
        body = await _run(who, lambda: api_get(who, url, params, branch=branch))
        return Page.model_validate(body)

    @mcp.tool(annotations=read_only)
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
        body = await _run(who, lambda: api_get(who, url, params, branch=branch))
        return BlameOut.model_validate(body)

    @mcp.tool(annotations=read_only)
    async def diff_entity(
        ctx: Context,
        namespace: str,
        kind: str,
        slug: str,
        from_changeset: Annotated[str | None, Field(description="A changeset id")] = None,
        from_time: Annotated[str | None, Field(description="RFC 3339")] = None,
        to_changeset: Annotated[
            str | None, Field(description="A changeset id; absent: now")
        ] = None,
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
        body = await _run(who, lambda: api_get(who, url, params, branch=branch))
        return DiffOut.model_validate(body)

    @mcp.tool(annotations=mutating)
    async def revert_changeset(
        ctx: Context,
        changeset_id: str,
        comment: str = "",
        metadata: dict[str, Any] | None = None,
        branch: Annotated[str, Field(description=BRANCH_HELP)] = "",
        plan_token: Annotated[str | None, Field(description=PLAN_TOKEN_HELP)] = None,
    ) -> WriteOut:
        """Undo a changeset as a new changeset. Dry run unless given its plan_token."""
        who = caller_of(ctx)
        body = await _run(
            who,
            lambda: writes.revert_changeset(
                who,
                changeset_id=changeset_id,
                comment=comment,
                metadata=metadata,
                branch=branch,
                plan_token=plan_token,
            ),
        )
        return WriteOut.model_validate(body)

    @mcp.tool(annotations=mutating)
    async def restore_entity(
        ctx: Context,
        namespace: str,
        kind: str,
        slug: str,
        version: Annotated[
            int | None, Field(description="Restore the content it had at this version.")
        ] = None,
        as_of: Annotated[str | None, Field(description=AS_OF_HELP)] = None,
        as_of_time: Annotated[str | None, Field(description=AS_OF_TIME_HELP)] = None,
        comment: str = "",
        metadata: dict[str, Any] | None = None,
        branch: Annotated[str, Field(description=BRANCH_HELP)] = "",
        plan_token: Annotated[str | None, Field(description=PLAN_TOKEN_HELP)] = None,
    ) -> WriteOut:
        """Make an entity equal its content at a version or an earlier point (deleting it if
        it did not exist then, re-creating it if deleted since). Give exactly one of version,
        as_of, as_of_time. Dry run unless given its plan_token."""
        who = caller_of(ctx)
        body = await _run(
            who,
            lambda: writes.restore_entity(
                who,
                namespace=namespace,
                kind=kind,
                slug=slug,
                version=version,
                as_of=as_of,
                as_of_time=as_of_time,
                comment=comment,
                metadata=metadata,
                branch=branch,
                plan_token=plan_token,
            ),
        )
        return WriteOut.model_validate(body)

    @mcp.tool(annotations=mutating)
    async def write_entities(
        ctx: Context,
        ops: Annotated[
            list[dict[str, Any]],
            Field(
                description='Batch ops as POST /api/v1/batch: {"op": "put", "namespace", "kind",'
                ' "slug", "content", "if_match"?, "if_none_match"?}, {"op": "patch", ...,'
                ' "patch"}, {"op": "delete", ...}'
            ),
        ],
        comment: str = "",
        metadata: dict[str, Any] | None = None,
        branch: Annotated[str, Field(description=BRANCH_HELP)] = "",
        plan_token: Annotated[str | None, Field(description=PLAN_TOKEN_HELP)] = None,
    ) -> WriteOut:
        """Apply an ordered op list as one changeset. Dry run unless given its plan_token."""
        who = caller_of(ctx)
        body = await _run(
            who,
            lambda: writes.write_entities(
                who,
                ops=ops,
                comment=comment,
                metadata=metadata,
                branch=branch,
                plan_token=plan_token,
            ),
        )
        return WriteOut.model_validate(body)

    _resources(mcp, caller_of)
    return mcp


ENTITY_TEMPLATE = "atlas://{namespace}/{kind}/{slug}"
CHANGESET_TEMPLATE = "atlas://changesets/{id}"


def entity_uri(entity: dict[str, Any]) -> str:
    return f"atlas://{entity['namespace']}/{entity['kind']}/{entity['slug']}"


def _resources(mcp: FastMCP, caller_of: Callable[[Context], Caller]) -> None:
    """Entities and changesets as resources; listing pages through visible entities.

    Registered on the SDK's low-level server (FastMCP's own templates match
    path segments only, and ``?as_of=`` is a query). Reading one is the same
    API read as ``get_entity`` / the changeset detail, so an invisible one is
    "not found" here too.
    """
    low = mcp._mcp_server

    @low.list_resources()
    async def list_resources(request: types.ListResourcesRequest) -> types.ListResourcesResult:
        who = caller_of(mcp.get_context())
        cursor = request.params.cursor if request.params else None
        params = {"page_size": MAX_RESOURCES_PER_PAGE, "page_token": cursor}
        body = await _run(who, lambda: api_get(who, reads.path("entities"), params))
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
        return [
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

    @low.read_resource()
    async def read_resource(uri: AnyUrl) -> Iterable[ReadResourceContents]:
        who = caller_of(mcp.get_context())
        url, params = _resource_read(str(uri))
        body = await _run(who, lambda: api_get(who, url, params))
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
