"""The write path's in-memory half: ops run against locked rows, folded to net changes.

Nothing here touches the database. :func:`run_ops` is step 2 of
``changeset_apply`` (ops in order, later ops seeing earlier ones) and
:func:`fold` is the rest of it (one net change per key, invariant 4), so the
rules a reviewer checks first sit apart from the statements that write.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast
from uuid import UUID

import json_merge_patch

from atlas import conf
from atlas.exceptions import NotFound, PayloadTooLarge, PreconditionFailed, ValidationFailed
from changesets.models import Op
from changesets.ops import DeleteOp, OpResult, PatchOp, PutOp, Status, WriteOp, canonical
from entities.store import EntityKey, EntityWrite, StoredEntity
from entities.validation import (
    MSG_BAD_TEXT,
    MSG_CONTENT_OBJECT,
    MSG_CONTENT_TOO_LARGE,
    as_stored,
    find_nul,
)


@dataclass(slots=True)
class KeyState:
    exists: bool
    content: dict[str, Any] | None
    version: int | None
    # ``content`` in canonical form (``ops.canonical``), made at most once.
    text: str | None = None


def text_of(state: KeyState) -> str:
    if state.text is None:
        state.text = canonical(state.content)
    return state.text


def _same(state: KeyState, content: Any, text: str) -> bool:
    """``same_content(state.content, content)``, reusing both canonical forms."""
    return state.content == content and text_of(state) == text


@dataclass(frozen=True, slots=True)
class NetChange:
    """One key's net change in a changeset: what its revision row records."""

    key: EntityKey
    op: Op
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    before_version: int | None
    after_version: int | None
    before_text: str | None
    after_text: str | None


@dataclass
class Folded:
    """:func:`fold`'s answer: the store's writes, the log's rows, and the keys that
    ended where they began (``unmoved``: no write, no revision)."""

    creates: list[EntityWrite] = field(default_factory=list)
    updates: list[EntityWrite] = field(default_factory=list)
    deletes: list[EntityKey] = field(default_factory=list)
    changes: list[NetChange] = field(default_factory=list)
    unmoved: set[EntityKey] = field(default_factory=set)


def check_precondition(op: WriteOp, state: KeyState) -> None:
    if_match = op.if_match
    if if_match is not None:
        if not state.exists:
            raise PreconditionFailed(
                f"{op.key} does not exist, so If-Match cannot hold.", pointer=op.pointer
            )
        allowed = if_match if isinstance(if_match, tuple) else (if_match,)
        if if_match != "*" and state.version not in allowed:
            *others, last = map(str, allowed)
            wanted = f"{', '.join(others)} or {last}" if others else last
            raise PreconditionFailed(
                f"{op.key} is at version {state.version}, not {wanted}.", pointer=op.pointer
            )
    if isinstance(op, PutOp) and op.if_none_match and state.exists:
        raise PreconditionFailed(f"{op.key} already exists.", pointer=op.pointer)


def checked_content(op: WriteOp, content: Any) -> tuple[dict[str, Any], str]:
    """Validate content whoever built the op (API, import, revert), and normalize
    it to what jsonb stores, so comparisons and revision images are exact.

    Returns the content and its canonical JSON text: the one serialization the
    size check, comparisons, the entity and revision rows and the chain share.
    """
    where = (op.pointer or "") + "/content"

    def invalid(detail: str, pointer: str) -> ValidationFailed:
        return ValidationFailed(
            detail, pointer=op.pointer, errors=[{"pointer": pointer, "detail": detail}]
        )

    if not isinstance(content, dict):
        raise invalid(MSG_CONTENT_OBJECT, where)
    bad = find_nul(content)
    if bad is not None:
        raise invalid(MSG_BAD_TEXT, where + bad)
    try:
        content = as_stored(content)
    except ValueError as exc:
        raise invalid(str(exc), where) from exc
    text = canonical(content)
    # Same measure as entities.validation.encoded_size (compact UTF-8; key order
    # does not change the length). At most 4 bytes a character: most content
    # needs no encoding to know it is under the limit.
    limit = conf.get("ATLAS_MAX_CONTENT_BYTES")
    if len(text) * 4 > limit and (size := len(text.encode())) > limit:
        raise PayloadTooLarge(
            MSG_CONTENT_TOO_LARGE.format(size=size, limit=limit), pointer=op.pointer
        )
    return content, text


def initial_states(
    keys: Sequence[EntityKey], initial: Mapping[EntityKey, StoredEntity]
) -> tuple[dict[EntityKey, KeyState], dict[EntityKey, KeyState]]:
    """The locked rows as key states: ``base`` (existing keys only, never replaced)
    and ``state`` (every key; :func:`run_ops` moves it on)."""
    base = {k: KeyState(True, e.content, e.version) for k, e in initial.items()}
    return base, {k: base.get(k) or KeyState(False, None, None) for k in keys}


def run_ops(
    ops: Sequence[WriteOp],
    state: dict[EntityKey, KeyState],
    *,
    initial: Mapping[EntityKey, StoredEntity],
    last_versions: Mapping[EntityKey, int],
) -> list[OpResult]:
    """Run ``ops`` in order against ``state`` (in place); one result per op.

    Preconditions are judged against the state the earlier ops left. Versions
    never restart: a re-created key continues after its last version
    (``last_versions``, from history), so an old ETag never matches a new
    incarnation.
    """

    def next_version(key: EntityKey) -> int:
        if key in initial:
            return initial[key].version + 1
        return last_versions.get(key, 0) + 1

    results: list[OpResult] = []
    for op in ops:
        cur = state[op.key]
        check_precondition(op, cur)
        if isinstance(op, DeleteOp):
            if not cur.exists and op.missing_ok:
                results.append(OpResult(op.pointer, "unchanged", None))
                continue
            if not cur.exists:
                raise NotFound(f"{op.key} does not exist.", pointer=op.pointer)
            state[op.key] = KeyState(False, None, None)
            results.append(OpResult(op.pointer, "deleted", None))
            continue
        if isinstance(op, PatchOp):
            if not cur.exists:
                raise NotFound(f"{op.key} does not exist.", pointer=op.pointer)
            new = json_merge_patch.merge(copy.deepcopy(cur.content), copy.deepcopy(op.patch))
        else:
            new = op.content
        new, text = checked_content(op, new)
        if cur.exists and _same(cur, new, text):
            results.append(OpResult(op.pointer, "unchanged", cur.version))
            continue
        status: Status = "updated" if cur.exists else "created"
        version = next_version(op.key)
        state[op.key] = KeyState(True, new, version, text)
        results.append(OpResult(op.pointer, status, version))
    return results


def _unmoved(before: KeyState | None, after: KeyState) -> bool:
    if after is before:
        return True
    if before is None:
        return not after.exists
    return after.exists and _same(before, after.content, text_of(after))


def _write(key: EntityKey, after: KeyState) -> EntityWrite:
    # Only for a key that exists after the batch, whose content and version are
    # set; KeyState types them Optional for a deleted key.
    content = cast("dict[str, Any]", after.content)
    return EntityWrite(key, content, cast(int, after.version), text_of(after))


def fold(
    keys: Sequence[EntityKey],
    base: Mapping[EntityKey, KeyState],
    state: Mapping[EntityKey, KeyState],
) -> Folded:
    """One net change per key, in ``keys`` order: first ``before``, last ``after``
    (invariant 4). A key that ends where it began is ``unmoved`` (e.g. created
    and deleted in one batch: no trace)."""
    out = Folded()
    # Bound once: this loop runs per key of a batch of up to 10,000.
    create, update, delete, change = (
        out.creates.append,
        out.updates.append,
        out.deletes.append,
        out.changes.append,
    )
    for key in keys:
        before, after = base.get(key), state[key]
        if _unmoved(before, after):
            out.unmoved.add(key)
            continue
        if before is None:
            op_kind = Op.CREATE
            create(_write(key, after))
        elif not after.exists:
            op_kind = Op.DELETE
            delete(key)
        else:
            op_kind = Op.UPDATE
            update(_write(key, after))
        change(
            NetChange(
                key=key,
                op=op_kind,
                before=before.content if before else None,
                after=after.content if after.exists else None,
                before_version=before.version if before else None,
                after_version=after.version if after.exists else None,
                before_text=text_of(before) if before else None,
                after_text=text_of(after) if after.exists else None,
            )
        )
    return out


def unmoved_results(
    ops: Sequence[WriteOp],
    results: list[OpResult],
    unmoved: set[EntityKey],
    initial: Mapping[EntityKey, StoredEntity],
) -> list[OpResult]:
    """Ops on a key that ends where it began moved nothing: say so, with the
    version the key really has, rather than a version never written."""
    if not unmoved:
        return results
    return [
        OpResult(r.pointer, "unchanged", initial[op.key].version if op.key in initial else None)
        if op.key in unmoved
        else r
        for op, r in zip(ops, results, strict=True)
    ]


def final_entities(
    initial: Mapping[EntityKey, StoredEntity],
    state: Mapping[EntityKey, KeyState],
    keys: Sequence[EntityKey],
    unmoved: set[EntityKey],
    changeset_id: UUID | None,
    now: datetime,
) -> dict[EntityKey, StoredEntity | None]:
    """Each key's state after the changeset, built from memory (no re-read)."""
    out: dict[EntityKey, StoredEntity | None] = {}
    for key in keys:
        after, before = state[key], initial.get(key)
        if not after.exists:
            out[key] = None
        elif before is not None and key in unmoved:
            out[key] = before
        else:
            out[key] = StoredEntity(
                key=key,
                content=after.content or {},
                version=after.version or 0,
                created_at=before.created_at if before else now,
                updated_at=now,
                changeset_id=changeset_id,
            )
    return out
