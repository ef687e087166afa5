"""Sync: move a branch's base point to baseline's head, merging baseline's newer changes in.

A branch reads through to baseline as it is now, except where its overlay
holds its own state of a key. Sync is about those keys: where baseline moved
one since the branch based its content on it (the overlay row's
``base_version`` is no longer baseline's version), the branch's content is
merged three-way with baseline's (:mod:`branches.keymerge`) and written to
the branch as one changeset (rpc ``SyncBranch``); every such row's
``base_version`` and the branch's base point move to what was merged. After
it, ``behind`` is 0 and a later merge finds no conflict the sync settled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from atlas.exceptions import Conflict, NotFound
from branches.exceptions import PlanMoved, SyncConflict
from branches.keymerge import Resolution, Triple, baseline_contents_at, merge_all
from branches.models import Branch
from branches.selectors import can_see
from branches.store import BranchStore, require_open
from changesets.merge3 import Granularity
from changesets.models import BASELINE, Changeset, Rpc
from changesets.ops import WriteOp
from changesets.services.apply import changeset_apply_planned, check_op_limit
from changesets.services.result import PlannedResult
from entities import writer
from entities.store import EntityKey, Locked, StoredEntity, guard_allows, load_json

# As for merge: how often a sync re-plans when writes keep slipping in before its locks.
SYNC_ATTEMPTS = 5


@dataclass(frozen=True)
class Moved:
    """An overlay key baseline moved since the branch based its content on it."""

    key: EntityKey
    changeset_id: UUID  # the branch changeset that last wrote the key
    base_version: int | None
    baseline_version: int | None
    baseline_content: dict[str, Any] | None


# Baseline rows of every overlay key, share-locked in key order (a no-op outside a
# transaction), then the overlay rows whose base is no longer baseline's version.
_MOVED = (
    "WITH b AS ("
    "  SELECT e.namespace_id, e.kind, e.slug, e.content, e.version"
    "  FROM entities_entity e JOIN branches_branchentity o2 ON o2.branch_id = %s"
    "   AND o2.namespace_id = e.namespace_id AND o2.kind = e.kind AND o2.slug = e.slug"
    "  ORDER BY e.namespace_id, e.kind, e.slug FOR SHARE OF e)"
    " SELECT o.namespace_id, o.kind, o.slug, o.changeset_id, o.base_version, b.version, b.content"
    " FROM branches_branchentity o LEFT JOIN b ON b.namespace_id = o.namespace_id"
    "  AND b.kind = o.kind AND b.slug = o.slug"
    " WHERE o.branch_id = %s AND o.base_version IS DISTINCT FROM b.version"
    " ORDER BY o.namespace_id, o.kind, o.slug"
)


def moved_keys(branch: Branch) -> list[Moved]:
    """The branch's keys baseline moved since their base, in key order; one statement."""
    with connection.cursor() as cursor:
        cursor.execute(_MOVED, [branch.pk, branch.pk])
        return [
            Moved(EntityKey(ns, kind, slug), cs, base, version, load_json(content))
            for ns, kind, slug, cs, base, version, content in cursor.fetchall()
        ]


def _fingerprint(moved: Sequence[Moved]) -> dict[EntityKey, tuple[UUID, int | None, int | None]]:
    return {m.key: (m.changeset_id, m.base_version, m.baseline_version) for m in moved}


class SyncStore(BranchStore):
    """The branch's store, plus a sync's re-check under the locks.

    :meth:`lock` locks as every branch write does (branch row ``FOR UPDATE``,
    baseline rows ``FOR SHARE``), reads baseline's head *first* (every
    changeset up to it is committed, so visible to what is read next), then
    the moved keys again under the locks; different from the plan →
    :class:`PlanMoved` and the sync plans again.
    """

    def __init__(self, branch: Branch, *, writer: Any, planned: Sequence[Moved]) -> None:
        super().__init__(branch, writer=writer)
        self._planned = _fingerprint(planned)
        self.moved: list[Moved] = []
        self.head: tuple[UUID, int] | None = None

    def lock(self, keys: Any, *, guard: Any = None) -> Locked:
        head = Changeset.objects.filter(branch=BASELINE).order_by("-seq").values_list("id", "seq")
        newest = head.first()
        locked = super().lock(keys, guard=guard)
        if not guard_allows(guard, locked.namespaces):
            return locked  # refused: the write service answers 403, nothing was locked
        self.head = (newest[0], newest[1]) if newest else None
        self.moved = moved_keys(Branch(pk=self.branch_id))
        if _fingerprint(self.moved) != self._planned:
            raise PlanMoved()
        return locked


def move_base_point(store: SyncStore, now: datetime) -> None:
    """Each moved row's base becomes the baseline version merged; the branch's base
    point the head read under the locks. Inside the sync's transaction."""
    if store.moved:
        rows = [[m.key.namespace, m.key.kind, m.key.slug, m.baseline_version] for m in store.moved]
        # Under the marker ``sync:<branch id>``, set and cleared in this one statement:
        # the overlay's guard lets it change nothing but base versions (branches 0005).
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH {writer.MARK_JOIN} AS MATERIALIZED"
                " (SELECT set_config('atlas.writer', %s, true)),"
                " u AS (UPDATE branches_branchentity o SET base_version = (k->>3)::int"
                f" FROM {writer.MARK_JOIN}, jsonb_array_elements(%s::jsonb) k"
                " WHERE o.branch_id = %s"
                " AND o.namespace_id = k->>0 AND o.kind = k->>1 AND o.slug = k->>2"
                " RETURNING 1)"
                f" SELECT {writer.done_sql('(SELECT count(*) FROM u)')}",
                [f"sync:{store.branch_id}", json.dumps(rows), store.branch_id],
            )
    fields: dict[str, Any] = {"synced_at": now}
    if store.head is not None:
        fields.update(base_changeset_id=store.head[0], base_seq=store.head[1])
    Branch.objects.filter(pk=store.branch_id).update(**fields)


@dataclass
class SyncResult:
    branch: Branch
    planned: PlannedResult

    @property
    def changeset(self) -> Changeset | None:
        return self.planned.changeset


def _planner(
    store: SyncStore,
    name: str,
    *,
    granularity: Granularity,
    resolutions: Sequence[Resolution],
    dry_run: bool,
) -> Any:
    def plan(current: Mapping[EntityKey, StoredEntity]) -> list[WriteOp]:
        bases = baseline_contents_at(
            {m.key: m.base_version for m in store.moved if m.base_version is not None}
        )
        triples = []
        for m in store.moved:
            mine = current.get(m.key)
            theirs = mine.content if mine is not None else None
            base = bases.get(m.key) if m.base_version is not None else None
            triples.append(Triple(m.key, base, m.baseline_content, theirs, current=theirs))
        ops, conflicts = merge_all(triples, granularity=granularity, resolutions=resolutions)
        if conflicts:
            raise SyncConflict(
                f"Branch {name!r} and baseline changed {len(conflicts)} pointer"
                f"{'' if len(conflicts) == 1 else 's'} differently; resolve them to sync.",
                conflicts=conflicts,
            )
        if not dry_run:
            move_base_point(store, timezone.now())
        return ops

    return plan


def branch_sync(
    *,
    branch: Branch,
    actor: User,
    granularity: Granularity = "key",
    resolutions: Sequence[Resolution] = (),
    dry_run: bool = False,
    comment: str = "",
    metadata: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
) -> SyncResult:
    """Move ``branch``'s base point to baseline's head (rpc ``SyncBranch`` when content moves).

    1. Plan outside any transaction: the overlay keys baseline moved since
       their base (:func:`moved_keys`); at most ``ATLAS_MAX_BATCH_OPS`` (413).
    2. ``changeset_apply`` on a :class:`SyncStore` for the branch, writing on
       behalf of ``actor`` (the branch's writer rule; writer role in each
       namespace, as for every branch write). Under its locks the moved keys
       are read again (different: plan again, at most :data:`SYNC_ATTEMPTS`).
    3. The plan, under the locks: per moved key the three-way merge of
       (base = baseline at ``base_version``, ours = baseline now, theirs = the
       branch), ``granularity`` ``key`` (pointer by pointer) or ``entity``
       (any change on both sides conflicts), after ``resolutions``. Any
       conflict left: 409 listing them all, nothing changed.
    4. Not a dry run: the moved rows' ``base_version`` and the branch's base
       point move (:func:`move_base_point`), in the same transaction as the
       branch changeset of every key whose merge differs from the branch's
       content. No such key: no changeset (invariant 3); the base point
       still moves.
    """
    if not can_see(Branch.objects.get(pk=branch.pk), actor):
        raise NotFound("No such branch.")
    require_open(branch.name, branch.status)
    for _ in range(SYNC_ATTEMPTS):
        moved = moved_keys(branch)
        check_op_limit(len(moved), what=f"Syncing branch {branch.name!r}")
        store = SyncStore(branch, writer=actor, planned=moved)
        plan = _planner(
            store, branch.name, granularity=granularity, resolutions=resolutions, dry_run=dry_run
        )
        try:
            result = changeset_apply_planned(
                store=store,
                actor=actor,
                rpc=Rpc.SYNC_BRANCH,
                keys=[m.key for m in moved],
                plan=plan,
                comment=comment,
                dry_run=dry_run,
                metadata=metadata,
                context=context,
            )
        except PlanMoved:
            continue
        return SyncResult(Branch.objects.get(pk=branch.pk), result)
    raise Conflict(f"Branch {branch.name!r} kept changing while it was being synced; retry.")
