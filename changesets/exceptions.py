"""Errors of the changeset log's services (rendered by atlas.api.errors)."""

from __future__ import annotations

from typing import Any

from atlas.exceptions import BadRequest, Conflict, Gone, PayloadTooLarge


class RevertConflict(Conflict):
    type, title = "revert-conflict", "The changeset cannot be reverted"


class ImportConflict(Conflict):
    type, title = "import-conflict", "The changeset cannot be imported"


class PlanChanged(Conflict):
    """A confirmed write would record something other than the plan it confirms (409).

    Raised by the write service under its row locks (``expect_plan``), so
    nothing is written: the caller dry-runs again and looks at the new plan.
    """

    type, title = "plan-changed", "The plan changed since the dry run"


class RestoreConflict(Conflict):
    """A scope restore found an entity moved on between planning and its locks (409)."""

    type, title = "restore-conflict", "The scope cannot be restored"


class NdjsonError(BadRequest):
    type, title = "invalid-ndjson", "Invalid changeset file"


class TooManyOps(PayloadTooLarge):
    """A changeset would hold more than ``ATLAS_MAX_BATCH_OPS`` ops (413).

    Raised by the write service for every path (batch, delete-by-query,
    revert, import, merge, restore, erase), dry runs included, before
    anything is written. The problem adds ``op_count`` and ``limit``.
    """

    type, title = "too-many-ops", "Too many ops for one changeset"

    def __init__(
        self, count: int, limit: int, *, pointer: str | None = None, what: str = ""
    ) -> None:
        detail = f"{count} ops; the limit is {limit}"
        super().__init__(f"{what} would write {detail}." if what else detail, pointer=pointer)
        self.count = count
        self.limit = limit

    def as_problem(self) -> dict[str, Any]:
        body = super().as_problem()
        body["op_count"] = self.count
        body["limit"] = self.limit
        return body


class Archived(Gone):
    """What was asked for lies at or before an archive cut: it is in the archive (410).

    The problem names the checkpoint that covers it (its chain ``hash``) and
    where the archive is (API.md "Archive and retention"), plus the cut as
    ``archived_before``; ``docs/retention.md`` says how to read it there.
    """

    type, title = "archived", "Archived"

    def __init__(
        self, detail: str, *, seq: int, checkpoint: str, archive: str, pointer: str | None = None
    ) -> None:
        super().__init__(detail, pointer=pointer)
        self.seq = seq
        self.checkpoint = checkpoint
        self.archive = archive

    def as_problem(self) -> dict[str, Any]:
        body = super().as_problem()
        body["checkpoint"] = self.checkpoint
        body["archive"] = self.archive
        body["archived_before"] = {"seq": self.seq, "checkpoint": self.checkpoint}
        return body
