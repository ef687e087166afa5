"""The op list the write service applies, and what it reports per op."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

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


def canonical(content: Any) -> str:
    """A byte-stable encoding: equal strings mean byte-identical JSON values.

    Python's ``==`` would call ``1`` and ``true`` equal; JSON does not.
    """
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def same_content(a: Any, b: Any) -> bool:
    """Byte-identical JSON values.

    ``==`` first: it is cheap, and values it calls different encode differently
    (JSON object keys are strings). It calls ``1``, ``1.0`` and ``true`` equal,
    so only when it says equal are the canonical forms compared.
    """
    return a == b and canonical(a) == canonical(b)


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
