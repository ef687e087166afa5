"""Restore: make an entity, or a whole scope, equal its state at an earlier point.

A restore is a new, forward changeset (rpc ``RestoreEntity`` or
``RestoreScope``) written through the one write path
(:func:`changesets.services.apply.changeset_apply`), never a rewind of the
log: its revisions record what it replaced, so reverting it gives back
exactly the state before it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User

from atlas import conf
from atlas.exceptions import NotFound, PayloadTooLarge
from changesets.exceptions import RestoreConflict
from changesets.models import Changeset, Rpc
from changesets.ops import DeleteOp, IfMatch, PutOp, WriteOp, same_content
from changesets.selectors.asof import entity_as_of
from changesets.selectors.log import entity_has_history
from changesets.selectors.restore import (
    ScopeChange,
    scope_as_of,
    scope_changes_baseline,
    version_content,
)
from changesets.services.apply import (
    ApplyResult,
    PlannedResult,
    changeset_apply,
    changeset_apply_planned,
    check_op_limit,
)
from entities import access
from entities.models import Namespace
from entities.store import EntityKey, EntityStore, StoredEntity

# On a branch, a scope restore holds both states of its scope in memory to diff
# them; beyond this many entities on either side it is refused (413: narrow it by
# kind or slug_prefix), as delete-by-query refuses more matches than one changeset
# takes. (On baseline PostgreSQL diffs them and only the changes are read.)
MAX_SCOPE_ENTITIES = 100_000


@dataclass(frozen=True)
class RestoreTarget:
    """What a restore makes the entity equal: ``content`` (None = absent) at
    ``version`` (None when absent), found by version or at ``as_of``."""

    content: dict[str, Any] | None
    version: int | None
    as_of: Changeset | None = None


@dataclass(frozen=True)
class EntityRestoreResult:
    applied: ApplyResult
    target: RestoreTarget


def restore_target(
    *,
    store: EntityStore,
    key: EntityKey,
    version: int | None = None,
    as_of: Changeset | None = None,
) -> RestoreTarget:
    """The state ``key`` is to be restored to: its content at ``version``, or at ``as_of``.

    Give one. A version the key never had is :class:`NotFound` (pointer
    ``/version``), as is a key with no history at all. ``as_of`` is a baseline
    changeset (as-of reads are baseline only); the key may have been absent
    then, and restoring deletes it.
    """
    if version is not None:
        found = version_content(key=key, version=version, branch=store.branch)
        if found is None:
            raise NotFound(f"{key} never had version {version}.", pointer="/version")
        return RestoreTarget(found.content, found.version)
    if as_of is None:
        raise TypeError("restore_target needs version or as_of")
    then = entity_as_of(seq=as_of.seq, key=key)
    if then is None and not _has_history(key, store):
        raise NotFound("No such entity.")
    return RestoreTarget(
        then.content if then else None, then.version if then else None, as_of=as_of
    )


def _has_history(key: EntityKey, store: EntityStore) -> bool:
    if entity_has_history(key=key):
        return True
    return bool(store.branch) and entity_has_history(key=key, branch=store.branch)


def entity_restore(
    *,
    store: EntityStore,
    actor: User,
    key: EntityKey,
    version: int | None = None,
    as_of: Changeset | None = None,
    if_match: IfMatch = None,
    if_none_match: bool = False,
    dry_run: bool = False,
    comment: str = "",
    metadata: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
    expect_plan: str | None = None,
) -> EntityRestoreResult:
    """Make ``key`` equal its content at ``version`` or ``as_of``, as one changeset
    (rpc ``RestoreEntity``); nothing is written when it already does.

    1. The target comes from the log (:func:`restore_target`), before any lock:
       history at or before a point never changes.
    2. One op goes to the write service: put the target back (re-creating the
       entity if it was deleted since), or delete it if it did not exist then.
    3. ``if_match`` / ``if_none_match`` ride on that op, so they are judged
       under the write service's row lock against the entity as it is at
       commit: a restore never overwrites a write it was not told about.

    ``expect_plan`` confirms a dry run's ``applied.plan`` (see ``changeset_apply``).
    """
    target = restore_target(store=store, key=key, version=version, as_of=as_of)
    op: WriteOp
    if target.content is None:
        op = DeleteOp(key, if_match=if_match, missing_ok=if_match is None)
    else:
        op = PutOp(key, target.content, if_match=if_match, if_none_match=if_none_match)
    applied = changeset_apply(
        store=store,
        actor=actor,
        ops=[op],
        rpc=Rpc.RESTORE_ENTITY,
        comment=comment,
        dry_run=dry_run,
        metadata=metadata,
        context=context,
        expect_plan=expect_plan,
    )
    return EntityRestoreResult(applied=applied, target=target)


def scope_restore(
    *,
    store: EntityStore,
    actor: User,
    namespace: str,
    as_of: Changeset,
    kind: str | None = None,
    slug_prefix: str | None = None,
    dry_run: bool = False,
    comment: str = "",
    metadata: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
) -> PlannedResult:
    """Make every entity of a scope equal its state right after ``as_of``, as one
    changeset (rpc ``RestoreScope``): creates, updates and deletes.

    1. The namespace must exist and be readable (else 404), and the actor may
       write it on this store (403), before anything is read.
    2. Set-based, never a query per entity (:func:`scope_changes`): the
       scope as it stood at ``as_of`` (baseline history) diffed against the
       scope as it is now on ``store``; only keys that differ become ops, at
       most ``ATLAS_MAX_BATCH_OPS`` (413 before any lock, dry runs too).
    3. The write service locks those keys and the plan runs under its locks:
       every key must still be as step 2 saw it (same version, or still
       absent). One that moved is a racing write: the whole restore is
       refused (409, ``reason: "moved_on"``), nothing written. An entity
       created in the scope after step 2 is not part of the restore, as if
       it had run a moment earlier.
    4. Ops in key order: put the as-of content, or delete.

    Reverting the changeset gives back exactly the state before the restore:
    its revisions' ``before`` images are the rows read under the locks.
    """
    row = Namespace.objects.filter(name=namespace).first()
    if row is None or not access.can_read(actor, namespace):
        raise NotFound(f"Namespace {namespace!r} not found.", pointer="/namespace")
    access.require_write(actor, {namespace: row}, branch=store.branch)
    found = scope_changes(
        store=store, seq=as_of.seq, namespace=namespace, kind=kind, slug_prefix=slug_prefix
    )
    check_op_limit(found.total, what="Restoring that scope")
    keys = [c.key for c in found.changes]  # in key order, as step 2 read them
    seen = {c.key: c.version_now for c in found.changes}
    then = {c.key: c.target for c in found.changes if c.target is not None}

    def plan(current: Mapping[EntityKey, StoredEntity]) -> list[WriteOp]:
        return _plan(keys, seen, then, current)

    return changeset_apply_planned(
        store=store,
        actor=actor,
        rpc=Rpc.RESTORE_SCOPE,
        keys=keys,
        plan=plan,
        comment=comment,
        dry_run=dry_run,
        metadata=metadata,
        context=context,
    )


@dataclass(frozen=True)
class ScopeChanges:
    """The keys of a scope whose content differs between a point and now (at most
    one changeset's worth), and how many differ in all."""

    changes: list[ScopeChange]
    total: int


def scope_changes(
    *,
    store: EntityStore,
    seq: int,
    namespace: str,
    kind: str | None = None,
    slug_prefix: str | None = None,
) -> ScopeChanges:
    """Step 2 of :func:`scope_restore`: what differs between changeset ``seq`` and
    ``store`` now, set-based.

    On baseline, one statement diffs the two states in PostgreSQL
    (:func:`~changesets.selectors.restore.scope_changes_baseline`): only the
    keys that differ are read. A branch store reads through to baseline in its
    own listing, so there both states are read (one statement each, at most
    ``MAX_SCOPE_ENTITIES`` entities, else 413) and diffed here, by exact JSON:
    the long way, which the tests hold the baseline statement to.
    """
    limit = conf.get("ATLAS_MAX_BATCH_OPS") + 1
    if not store.branch:
        changes, total = scope_changes_baseline(
            seq=seq, namespace=namespace, kind=kind, slug_prefix=slug_prefix, limit=limit
        )
        return ScopeChanges(changes, total)
    return scope_changes_in_memory(
        store=store, seq=seq, namespace=namespace, kind=kind, slug_prefix=slug_prefix
    )


def scope_changes_in_memory(
    *,
    store: EntityStore,
    seq: int,
    namespace: str,
    kind: str | None = None,
    slug_prefix: str | None = None,
) -> ScopeChanges:
    """:func:`scope_changes` the long way, for any store: both states read (one
    statement each), diffed here by exact JSON (``same_content``)."""
    limit = conf.get("ATLAS_MAX_BATCH_OPS") + 1
    cap = MAX_SCOPE_ENTITIES + 1
    then = {
        image.key: image.content
        for image in scope_as_of(
            seq=seq, namespace=namespace, kind=kind, slug_prefix=slug_prefix, limit=cap
        )
    }
    now = {
        e.key: e
        for e in store.list(
            namespaces=None, namespace=namespace, kind=kind, slug_prefix=slug_prefix, limit=cap
        )
    }
    if max(len(then), len(now)) > MAX_SCOPE_ENTITIES:
        raise PayloadTooLarge(
            f"More than {MAX_SCOPE_ENTITIES} entities in scope; narrow it (kind, slug_prefix).",
            pointer="/namespace",
        )
    changes = []
    for key in sorted(then.keys() | now.keys()):
        old, current = then.get(key), now.get(key)
        if current is None or old is None or not same_content(old, current.content):
            changes.append(ScopeChange(key, old, current.version if current else None))
    return ScopeChanges(changes[:limit], len(changes))


def _plan(
    keys: Sequence[EntityKey],
    seen: Mapping[EntityKey, int | None],
    then: Mapping[EntityKey, dict[str, Any]],
    current: Mapping[EntityKey, StoredEntity],
) -> list[WriteOp]:
    """Step 3 and 4 of :func:`scope_restore`, under the write service's locks."""
    conflicts: list[dict[str, Any]] = []
    ops: list[WriteOp] = []
    for key in keys:
        row = current.get(key)
        if (row.version if row is not None else None) != seen[key]:
            conflicts.append(
                {
                    "namespace": key.namespace,
                    "kind": key.kind,
                    "slug": key.slug,
                    "reason": "moved_on",
                    "newer_changeset_id": str(row.changeset_id) if row else None,
                }
            )
            continue
        target = then.get(key)
        ops.append(DeleteOp(key) if target is None else PutOp(key, target))
    if conflicts:
        raise RestoreConflict(
            f"{len(conflicts)} entit{'y' if len(conflicts) == 1 else 'ies'} changed while"
            " the restore was planned; nothing was restored. Try again.",
            conflicts=conflicts,
        )
    return ops
