"""The op list the write service applies, and what it reports per op."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from changesets.canonical import canonical as canonical
from changesets.canonical import same_content as same_content
from entities.store import EntityKey

IfMatch = int | tuple[int, ...] | Literal["*"] | None


@dataclass(frozen=True)
class PutOp:
    key: EntityKey
    content: dict[str, Any]
    if_match: IfMatch = None
    if_none_match: bool = False
    pointer: str | None = None


@dataclass(frozen=True)
class PatchOp:
    key: EntityKey
    patch: dict[str, Any]
    if_match: IfMatch = None
    pointer: str | None = None


@dataclass(frozen=True)
class DeleteOp:
    key: EntityKey
    if_match: IfMatch = None
    pointer: str | None = None
    # Delete-by-query selects before it locks: a key deleted in between is skipped.
    missing_ok: bool = False


WriteOp = PutOp | PatchOp | DeleteOp

Status = Literal["created", "updated", "deleted", "unchanged"]


@dataclass(frozen=True)
class OpResult:
    pointer: str | None
    status: Status
    version: int | None


def op_repr(op: WriteOp) -> dict[str, Any]:
    """A put/delete op in the shape of a batch op (how revert and import report theirs)."""
    body: dict[str, Any] = {
        "op": "put" if isinstance(op, PutOp) else "patch" if isinstance(op, PatchOp) else "delete",
        "namespace": op.key.namespace,
        "kind": op.key.kind,
        "slug": op.key.slug,
    }
    if isinstance(op, PutOp):
        body["content"] = op.content
    return body
