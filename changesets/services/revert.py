"""Revert: undo a changeset as a new, forward changeset (never a rewind)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from django.contrib.auth.models import User

from atlas.exceptions import NotFound, ValidationFailed
from changesets.archive import boundary
from changesets.exceptions import RevertConflict
from changesets.merge3 import Granularity, merge3
from changesets.models import BASELINE, Changeset, Revision, Rpc
from changesets.ops import DeleteOp, PutOp, WriteOp, same_content
from changesets.selectors import changeset_ids
from changesets.selectors.log import revisions_of
from changesets.services.apply import PlannedResult, changeset_apply_planned
from entities import access
from entities.store import EntityKey, EntityStore, StoredEntity


def _key(revision: Revision) -> EntityKey:
    return EntityKey(revision.namespace, revision.kind, revision.slug)


def _last_writer(key: EntityKey, store: EntityStore) -> str | None:
    """The changeset that last changed ``key`` as seen from ``store`` (for a conflict report)."""
    branches = [store.branch] if store.branch == BASELINE else [store.branch, BASELINE]
    newest = max(
        (
            found
            for on in branches
            if (
                found := Revision.objects.of_entity(on, key.namespace, key.kind, key.slug)
                .order_by("-seq")
                .values_list("seq", "changeset_id")
                .first()
            )
            is not None
        ),
        default=None,
    )
    return str(newest[1]) if newest else None


def revert_target(*, actor: User, changeset_id: str) -> Changeset:
    """The changeset ``actor`` may revert, or :class:`NotFound` exactly like a missing one.

    Part of it invisible to the caller: they cannot undo what they cannot see,
    and a 403 would confirm ops they may not know of (API.md "Limits and
    visibility"). Decided on the row's namespaces, before a revision is read.
    The API calls this before reading the body (a 422 for a bad body must not
    tell a hidden changeset from a missing one), then hands the row to
    :func:`changeset_revert`, so a revert loads it once. One at or before an
    archive cut (or an unknown id that may be archived) is a 410.
    """
    try:
        uuid.UUID(str(changeset_id))
    except ValueError as exc:
        raise NotFound("No such changeset.") from exc
    changeset = changeset_ids.find(Changeset.objects.all(), changeset_id)
    if changeset is None:
        boundary.check_unknown_changeset(changeset_id)  # archived: its pre-images are gone
        raise NotFound("No such changeset.")
    if any(not access.can_read(actor, ns) for ns in changeset.namespaces):
        raise NotFound("No such changeset.")
    boundary.check_seq(changeset.seq, "That changeset is archived and cannot be reverted.")
    return changeset


def changeset_revert(
    *,
    store: EntityStore,
    actor: User,
    changeset_id: str | None = None,
    changeset: Changeset | None = None,
    dry_run: bool = False,
    comment: str = "",
    metadata: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
    granularity: Granularity = "entity",
    only: Sequence[EntityKey] | None = None,
    expect_plan: str | None = None,
) -> PlannedResult:
    """Write the inverse of a changeset as one new changeset (rpc ``RevertChangeset``).

    1. Pre-images come from the original changeset's revision rows, whatever
       store the undo lands in (baseline, or a branch staging it).
    2. Under the write service's row locks, each entity must still hold what
       the changeset left (its ``after``); one already back at its ``before``
       is skipped; anything else "moved on" and the whole revert is refused
       with every such entity listed. Nothing is written unless all apply.
    3. Ops unwind newest first: ``before`` present → put it back; ``before``
       null (the changeset created it) → delete.

    ``granularity="key"`` replaces step 2's whole-entity test with the one
    three-way merge (:func:`changesets.merge3.merge3`: base = the changeset's
    ``after``, ours = the locked current content, theirs = its ``before``), so
    later edits to other pointers survive the undo; a pointer both changed is
    a ``key_moved_on`` conflict naming it with base, ours and theirs. Decided
    under the same locks, so a racing write is either seen or waits.
    ``only`` limits the undo to those of the changeset's entities (a ref it
    did not touch is 422, pointer ``/only/<i>``).

    Name it by ``changeset_id``, or pass the row :func:`revert_target` gave
    (``changeset``); one with an op in a namespace the actor cannot read is
    :class:`NotFound`, exactly like a missing one. The inverse is held to
    ``ATLAS_MAX_BATCH_OPS`` ops like any write (``check_op_limit``).
    ``expect_plan`` confirms a dry run's ``applied.plan`` (see ``changeset_apply``).
    """
    if changeset is None:
        changeset = revert_target(actor=actor, changeset_id=str(changeset_id))
    revisions = list(revisions_of(changeset).order_by("-id"))
    if only is not None:
        revisions = _only(revisions, only)
    keys = [_key(r) for r in revisions]

    def plan(current: Mapping[EntityKey, StoredEntity]) -> list[WriteOp]:
        if granularity == "key":
            return _plan_keys(revisions, current)
        return _plan(revisions, current, store)

    return changeset_apply_planned(
        store=store,
        actor=actor,
        rpc=Rpc.REVERT_CHANGESET,
        comment=comment,
        dry_run=dry_run,
        keys=keys,
        plan=plan,
        metadata=metadata,
        context=context,
        expect_plan=expect_plan,
    )


MSG_NOT_TOUCHED = "This changeset did not touch that entity."


def _only(revisions: list[Revision], only: Sequence[EntityKey]) -> list[Revision]:
    """The revisions of the entities named in ``only`` (422 for one the changeset
    did not touch, every such ref listed)."""
    touched = {_key(r) for r in revisions}
    errors = [
        {"pointer": f"/only/{i}", "detail": MSG_NOT_TOUCHED}
        for i, k in enumerate(only)
        if k not in touched
    ]
    if errors:
        raise ValidationFailed(MSG_NOT_TOUCHED, pointer=errors[0]["pointer"], errors=errors)
    wanted = set(only)
    return [r for r in revisions if _key(r) in wanted]


def _plan_keys(
    revisions: Sequence[Revision], current: Mapping[EntityKey, StoredEntity]
) -> list[WriteOp]:
    """Key-level inverse ops, newest first, read under the write service's locks.

    Per entity, :func:`merge3` of (base = ``after``, ours = now, theirs =
    ``before``): a clean merge equal to now is skipped, a clean merge is put
    (deleted when it is absent: the changeset created the entity and nothing
    changed it since), and every conflict of every entity is collected before
    the whole revert is refused.
    """
    ops: list[WriteOp] = []
    conflicts: list[dict[str, Any]] = []
    for revision in revisions:
        key = _key(revision)
        now = current.get(key)
        ours = now.content if now is not None else None
        merged = merge3(revision.after, ours, revision.before)
        for c in merged.conflicts:
            conflicts.append(
                {
                    "namespace": key.namespace,
                    "kind": key.kind,
                    "slug": key.slug,
                    "pointer": c.pointer,
                    "reason": "key_moved_on",
                    "base": c.base,
                    "ours": c.ours,
                    "theirs": c.theirs,
                }
            )
        if merged.conflicts or _holds(ours, merged.content):
            continue
        ops.append(DeleteOp(key) if merged.content is None else PutOp(key, merged.content))
    if conflicts:
        raise RevertConflict(
            f"{len(conflicts)} pointer{' was' if len(conflicts) == 1 else 's were'} changed"
            " again since this changeset; revert the newer changesets first, or revert"
            ' the other entities with "only".',
            conflicts=conflicts,
        )
    return ops


def _plan(
    revisions: Sequence[Revision], current: Mapping[EntityKey, StoredEntity], store: EntityStore
) -> list[WriteOp]:
    """The inverse ops, newest first, read under the write service's locks; every
    entity that moved on is collected, then the whole revert is refused."""
    ops: list[WriteOp] = []
    conflicts: list[dict[str, Any]] = []
    for revision in revisions:
        key = _key(revision)
        now = current.get(key)
        now_content = now.content if now is not None else None
        if _holds(now_content, revision.before):
            continue  # already back at the pre-image
        if not _holds(now_content, revision.after):
            newer = str(now.changeset_id) if now is not None else _last_writer(key, store)
            conflicts.append(
                {
                    "namespace": key.namespace,
                    "kind": key.kind,
                    "slug": key.slug,
                    "reason": "moved_on",
                    "newer_changeset_id": newer,
                }
            )
            continue
        if revision.before is None:
            ops.append(DeleteOp(key))
        else:
            ops.append(PutOp(key, revision.before))
    if conflicts:
        raise RevertConflict(
            f"{len(conflicts)} entit{'y has' if len(conflicts) == 1 else 'ies have'} moved on"
            " since this changeset; revert the newer changesets first.",
            conflicts=conflicts,
        )
    return ops


def _holds(current: dict[str, Any] | None, image: dict[str, Any] | None) -> bool:
    if current is None or image is None:
        return current is None and image is None
    return same_content(current, image)
