"""The mutating tools: dry run unless confirmed (:mod:`atlas.mcp.writes`).

Each tool's signature is its input schema (FastMCP builds the JSON Schema
from it); its body hands the arguments to the write in ``writes``, which
runs the write service as a dry run, or with ``expect_plan`` when given the
``plan_token`` that dry run returned.
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp import types
from mcp.server.fastmcp import Context, FastMCP
from pydantic import Field

from atlas.mcp import writes
from atlas.mcp.bridge import caller_of, run_in_django
from atlas.mcp.schema import AS_OF_HELP, AS_OF_TIME_HELP, BRANCH_HELP, PLAN_TOKEN_HELP, WriteOut

MUTATING = types.ToolAnnotations(
    readOnlyHint=False, destructiveHint=True, idempotentHint=False, openWorldHint=False
)


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
    body = await run_in_django(
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
    body = await run_in_django(
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
    body = await run_in_django(
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


# In the order clients list them (after the read tools).
TOOLS = (revert_changeset, restore_entity, write_entities)


def register(mcp: FastMCP) -> None:
    """Add the mutating tools to ``mcp``, marked destructive and not idempotent."""
    for tool in TOOLS:
        mcp.tool(annotations=MUTATING)(tool)
