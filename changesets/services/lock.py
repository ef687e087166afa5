"""Step 1 of a write and the checks around it: lock (or read) the keys' rows and
authorize the actor, bound the op count, check a plan's ops under those locks,
and find the versions absent keys had.

What :func:`changesets.services.apply.changeset_apply` asks before it changes
anything, so that a refused or oversized write locks and writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from django.contrib.auth.models import User
from django.db import connection

from atlas import conf
from atlas.exceptions import NotFound
from changesets import keyhash
from changesets.exceptions import PlanChanged, TooManyOps
from changesets.ops import WriteOp
from changesets.services.netchange import Folded
from changesets.services.plans import plan_digest
from entities import access
from entities.models import Namespace
from entities.store import EntityKey, EntityStore, OptimisticStore, StoredEntity

# Decides a write's ops from the locked rows of its keys (revert, merge).
Planner = Callable[[Mapping[EntityKey, StoredEntity]], Sequence[WriteOp]]


def check_op_limit(count: int, *, what: str = "") -> None:
    """Refuse a changeset of more than ``ATLAS_MAX_BATCH_OPS`` ops (413, :class:`TooManyOps`).

    The one rule behind API.md's "no changeset, from any path, has more than
    ``ATLAS_MAX_BATCH_OPS`` ops". ``changeset_apply`` calls it for every
    write, dry runs included: on the given ops before any row is locked, on a
    plan's ops as soon as the plan returns (before anything is written). It
    counts ops, not net changes: a changeset's revisions are at most its ops,
    so the bound holds for the changeset, and a request is refused the same
    way whatever state it meets. A caller that knows its count before calling
    (an import file) may call it first to refuse without locking anything;
    ``what`` names the request in the detail ("Merging branch 'x'").
    """
    limit = conf.get("ATLAS_MAX_BATCH_OPS")
    if count > limit:
        raise TooManyOps(count, limit, what=what)


def lock_rows(
    store: EntityStore,
    actor: User,
    touched: Sequence[tuple[EntityKey, str | None]],
    keys: Sequence[EntityKey],
    *,
    check_permissions: bool,
    for_update: bool = True,
) -> dict[EntityKey, StoredEntity]:
    """Step 1: lock the keys' existing rows; refuse a missing namespace (404) or
    a role the actor lacks (403).

    Namespaces must exist (staff create them) and be writable by the actor.
    The store reads them in its lock statement, locking rows only where the
    guard says the actor may write, so a refused caller never holds a lock.
    An actor whose roles are not loaded yet (a request's user) gets a pending
    guard: the lock statement reads its role rows in those namespaces too and
    the check below decides from them, at no round trip (``entities.access.WriteGuard``).
    Without ``for_update`` (an unlocked write) the statement locks nothing.
    """
    first_pointer: dict[str, str | None] = {}
    for key, pointer in touched:
        first_pointer.setdefault(key.namespace, pointer)
    guard = access.write_guard(actor, branch=store.branch) if check_permissions else None
    if for_update:
        initial, existing = store.lock(keys, guard=guard)
    else:
        initial, existing = cast(OptimisticStore, store).lock(keys, guard=guard, for_update=False)
    for name, pointer in first_pointer.items():
        if name not in existing:
            raise NotFound(f"Namespace {name!r} not found.", pointer=pointer)
    if check_permissions:
        namespaces = {  # in name order: the order the checks ran in before
            name: Namespace.from_db(connection.alias, ["name", "protected"], (name, existing[name]))
            for name in sorted(existing)
        }
        roles = guard.learned_roles() if guard is not None else None
        access.require_write(
            actor, namespaces, branch=store.branch, pointers=first_pointer, roles=roles
        )
    return initial


def confirm_plan(expect_plan: str, branch: str, folded: Folded) -> None:
    """Refuse (:class:`PlanChanged`) a write whose net changes are not the previewed plan."""
    if plan_digest(branch=branch, changes=folded.changes) != expect_plan:
        raise PlanChanged(
            "What this write would record is not the plan it confirms: the entities"
            " changed since the dry run. Nothing was written; dry-run again."
        )


def planned_ops(
    plan: Planner, initial: Mapping[EntityKey, StoredEntity], keys: Sequence[EntityKey]
) -> list[WriteOp]:
    """A plan's ops, decided under the locks; counted against the op limit at once."""
    ops = list(plan(initial))
    check_op_limit(len(ops))
    stray = {op.key for op in ops} - set(keys)
    if stray:
        raise AssertionError(f"plan touched keys it did not lock: {sorted(stray)}")
    return ops


# ``r``'s revisions of the key ``k`` names, on baseline and on ``k``'s branch.
_BASELINE_KEY = keyhash.joined("r", "k", branch="''")
_BRANCH_KEY = keyhash.joined("r", "k")


def last_versions(branch: str, keys: Sequence[EntityKey]) -> dict[EntityKey, int]:
    """The highest version each (currently absent) key ever had, from its history.

    On a branch, the baseline's history counts too: a branch's versions of a
    key continue the baseline's, so an ETag never names two different states.
    """
    # Raw SQL buys a LATERAL newest-revision probe per key on ``revision_key``, in one
    # statement; the keys go over as one JSON document, like every write statement's.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT k.namespace, k.kind, k.slug, GREATEST(b.v, o.v)"
            " FROM (SELECT v->>0 AS namespace, v->>1 AS kind, v->>2 AS slug, %s::text AS branch"
            "  FROM jsonb_array_elements(%s::jsonb) v) k"
            " LEFT JOIN LATERAL ("
            "   SELECT COALESCE(r.after_version, r.before_version) AS v"
            "   FROM changesets_revision r"
            f"  WHERE {_BASELINE_KEY}"
            "   ORDER BY r.seq DESC LIMIT 1) b ON TRUE"
            " LEFT JOIN LATERAL ("
            "   SELECT COALESCE(r.after_version, r.before_version) AS v"
            "   FROM changesets_revision r"
            f"  WHERE {_BRANCH_KEY} AND k.branch <> ''"
            "   ORDER BY r.seq DESC LIMIT 1) o ON TRUE"
            " WHERE b.v IS NOT NULL OR o.v IS NOT NULL",
            [branch, json.dumps([[k.namespace, k.kind, k.slug] for k in keys])],
        )
        return {EntityKey(ns, kind, slug): v for ns, kind, slug, v in cursor.fetchall()}
