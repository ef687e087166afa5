"""The words and shapes of the tools' schemas: argument help and output models.

FastMCP builds each tool's input JSON Schema from its signature (the help
strings below are its ``description``s) and its output schema from the
return annotation. Outputs name the fields the API documents; ``extra``
members pass through as the API sent them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PAGE_SIZE_HELP = "Results per page (default 50, max 500)."
PAGE_TOKEN_HELP = "next_page_token of the previous page."
BRANCH_HELP = 'A branch name; "" (default) is baseline.'
AS_OF_HELP = "A changeset id: the state right after it landed (baseline only)."
AS_OF_TIME_HELP = "RFC 3339: the newest baseline changeset at or before it."
PLAN_TOKEN_HELP = "The plan_token of this tool's own dry run (same arguments): writes that plan."


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
