"""Import: apply an exported changeset file as one new changeset.

The file format (export lines, strict parsing) is :mod:`changesets.ndjson`;
this is the write, planned under the write service's locks like revert.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.contrib.auth.models import User

from changesets.exceptions import ImportConflict
from changesets.models import Rpc
from changesets.ndjson import ChangesetFile, FileOp
from changesets.ops import DeleteOp, PutOp, WriteOp, same_content
from changesets.services.apply import PlannedResult, changeset_apply_planned, check_op_limit
from entities.store import EntityKey, EntityStore, StoredEntity


def changeset_import(
    *,
    store: EntityStore,
    actor: User,
    document: ChangesetFile,
    dry_run: bool = False,
    comment: str | None = None,
    check_permissions: bool = True,
    context: Mapping[str, Any] | None = None,
) -> PlannedResult:
    """Apply a parsed file as one new changeset (rpc ``ImportChangeset``).

    Each op's ``before`` must equal the entity's current content (null: it
    must not exist), judged under the write service's locks and in file
    order, so a file that repeats a key sees its own earlier ops. Any
    mismatch refuses the whole file (409, ``preimage_mismatch``).

    A file of more than ``ATLAS_MAX_BATCH_OPS`` ops is refused (413) before
    any row is locked: the plan makes one op per line.

    The envelope's ``metadata`` becomes the new changeset's; its ``context``
    (how the exported changeset was written) does not: the import records its
    own (``context``, the importing request's; none: a system write).
    """
    check_op_limit(len(document.ops))
    keys = list(dict.fromkeys(op.key for op in document.ops))

    def plan(current: Mapping[EntityKey, StoredEntity]) -> list[WriteOp]:
        return _plan(document.ops, keys, current)

    return changeset_apply_planned(
        store=store,
        actor=actor,
        rpc=Rpc.IMPORT_CHANGESET,
        comment=document.envelope["comment"] if comment is None else comment,
        dry_run=dry_run,
        keys=keys,
        plan=plan,
        check_permissions=check_permissions,
        metadata=document.envelope.get("metadata"),
        context=context,
    )


def _plan(
    file_ops: Sequence[FileOp],
    keys: Sequence[EntityKey],
    current: Mapping[EntityKey, StoredEntity],
) -> list[WriteOp]:
    """The file's ops as write ops, each checked against the state the ones before
    it leave; every mismatch is collected, then the whole file is refused."""
    state: dict[EntityKey, dict[str, Any] | None] = {
        k: (current[k].content if k in current else None) for k in keys
    }
    conflicts: list[dict[str, Any]] = []
    ops: list[WriteOp] = []
    for op in file_ops:
        now = state[op.key]
        matches = (now is None and op.before is None) or (
            now is not None and op.before is not None and same_content(now, op.before)
        )
        if not matches:
            conflicts.append(
                {
                    "namespace": op.key.namespace,
                    "kind": op.key.kind,
                    "slug": op.key.slug,
                    "reason": "preimage_mismatch",
                    "line": op.line,
                }
            )
        pointer = f"/line/{op.line}"
        ops.append(
            DeleteOp(op.key, pointer=pointer)
            if op.after is None
            else PutOp(op.key, op.after, pointer=pointer)
        )
        state[op.key] = op.after
    if conflicts:
        raise ImportConflict(
            f"{len(conflicts)} op(s) expect a state the store no longer holds.",
            conflicts=conflicts,
        )
    return ops
