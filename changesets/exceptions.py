"""Errors of the changeset log's services (rendered by atlas.api.errors)."""

from __future__ import annotations

from atlas.exceptions import BadRequest, Conflict


class RevertConflict(Conflict):
    type, title = "revert-conflict", "The changeset cannot be reverted"


class ImportConflict(Conflict):
    type, title = "import-conflict", "The changeset cannot be imported"


class NdjsonError(BadRequest):
    type, title = "invalid-ndjson", "Invalid changeset file"
