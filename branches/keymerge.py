"""Key-level merge and sync: the three-way merge per entity, with resolutions.

Both key-level merge (``branches.services.branch_merge``) and sync
(``branches.sync.branch_sync``) merge, per entity the branch changed, with the
one three-way merge (:func:`changesets.merge3.merge3`):

- base: baseline's content at ``base_version``, the baseline version the
  branch's content of that entity is based on (when the branch first wrote
  it, or the last sync). That is "baseline at the branch's base point" for
  every entity baseline did not move between the base point and the branch's
  first write of it; for one it did, the branch saw (and kept) that move, so
  the later version is the truer base and reports fewer false conflicts;
- ours: baseline now (``None``: absent);
- theirs: the branch (``None``: its tombstone).

Resolutions settle conflicts before anything is refused: one without a
pointer takes the whole entity from one side; one with a pointer settles
every conflict at or inside it (``take: branch`` sets the branch's value there;
``baseline`` keeps baseline's). Resolutions naming nothing in conflict are
ignored, so a client may send the same list again after the state moved.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from django.db import connection

from changesets import keyhash
from changesets.archive import boundary
from changesets.merge3 import Conflict, Doc, Granularity, merge3, take
from changesets.ops import DeleteOp, PutOp, WriteOp, same_content
from entities.store import EntityKey, load_json

Side = Literal["branch", "baseline"]
SIDES: tuple[Side, ...] = ("branch", "baseline")


@dataclass(frozen=True)
class Resolution:
    key: EntityKey
    take: Side
    pointer: str | None = None  # None: the whole entity


@dataclass(frozen=True)
class Outcome:
    """One entity's merge after resolutions: its content, and conflicts left."""

    key: EntityKey
    content: Doc
    conflicts: list[Conflict]


# ``r``'s baseline revisions of the key ``k`` names: a seek on ``revision_key``.
_BASELINE_KEY = keyhash.joined("r", "k", branch="''")


def resolve(
    key: EntityKey,
    base: Doc,
    ours: Doc,
    theirs: Doc,
    *,
    granularity: Granularity,
    resolutions: Sequence[Resolution] = (),
) -> Outcome:
    """Merge one entity, then apply the resolutions that name it."""
    mine = [r for r in resolutions if r.key == key]
    whole = next((r for r in mine if r.pointer is None), None)
    if whole is not None:
        return Outcome(key, theirs if whole.take == "branch" else ours, [])
    merged = merge3(base, ours, theirs, granularity=granularity)
    content, left = merged.content, []
    for conflict in merged.conflicts:
        settling = _settling(conflict.pointer, mine)
        if settling is None:
            left.append(conflict)
        elif settling.take == "branch":
            content = take(content, theirs, conflict.pointer)
    return Outcome(key, content, left)


def _settling(pointer: str, resolutions: Iterable[Resolution]) -> Resolution | None:
    """The most specific resolution at or containing ``pointer``."""
    found = [
        r
        for r in resolutions
        if r.pointer is not None and (r.pointer == pointer or pointer.startswith(r.pointer + "/"))
    ]
    return max(found, key=lambda r: len(r.pointer or ""), default=None)


def conflict_repr(key: EntityKey, conflict: Conflict) -> dict[str, Any]:
    """A merge or sync conflict as the 409 lists it (reason ``key_conflict``)."""
    return {
        "namespace": key.namespace,
        "kind": key.kind,
        "slug": key.slug,
        "pointer": conflict.pointer,
        "reason": "key_conflict",
        "base": conflict.base,
        "ours": conflict.ours,
        "theirs": conflict.theirs,
    }


def outcome_op(outcome: Outcome, current: Doc) -> WriteOp | None:
    """The op that takes ``current`` to the outcome's content (None: nothing to do)."""
    if same_content(outcome.content, current):
        return None
    if outcome.content is None:
        return DeleteOp(outcome.key, missing_ok=True)
    return PutOp(outcome.key, outcome.content)


@dataclass(frozen=True)
class Triple:
    """One entity to merge: its base, ``ours``, ``theirs``, and the content the
    write starts from (``current``: what the op must take to the outcome)."""

    key: EntityKey
    base: Doc
    ours: Doc
    theirs: Doc
    current: Doc


def merge_all(
    triples: Iterable[Triple],
    *,
    granularity: Granularity,
    resolutions: Sequence[Resolution] = (),
) -> tuple[list[WriteOp], list[dict[str, Any]]]:
    """Merge each entity (:func:`resolve`): the ops that write the clean outcomes,
    and every conflict left, as the 409 lists them. Merge and sync raise their own
    refusal when the second is not empty, so no op is written then."""
    ops: list[WriteOp] = []
    conflicts: list[dict[str, Any]] = []
    for t in triples:
        outcome = resolve(
            t.key, t.base, t.ours, t.theirs, granularity=granularity, resolutions=resolutions
        )
        conflicts += [conflict_repr(t.key, c) for c in outcome.conflicts]
        op = outcome_op(outcome, t.current)
        if op is not None and not outcome.conflicts:
            ops.append(op)
    return ops, conflicts


def baseline_contents_at(wanted: Mapping[EntityKey, int]) -> dict[EntityKey, dict[str, Any]]:
    """Baseline's content of each key at the given version, from the log; one statement.

    Versions of a key never repeat on baseline (a re-create continues them),
    so ``after_version`` names one revision; history is complete (invariant
    1), so it is there. A LATERAL probe per key on ``revision_key``; after an
    archive cut, on the state at the cut too (a cut never passes an open
    branch's fork, so the versions it started from are held).
    """
    if not wanted:
        return {}
    keys = [[k.namespace, k.kind, k.slug, v] for k, v in wanted.items()]
    # Raw SQL buys one statement for any number of keys (the write path's JSON key list).
    sql = boundary.sourced(
        "SELECT k.namespace, k.kind, k.slug, r.after"
        " FROM (SELECT v->>0 AS namespace, v->>1 AS kind, v->>2 AS slug,"
        "  (v->>3)::int AS ver FROM jsonb_array_elements(%s::jsonb) v) k"
        " JOIN LATERAL (SELECT r.after FROM {source} r"
        f"  WHERE {_BASELINE_KEY} AND r.after_version = k.ver{{live:r}}"
        "  ORDER BY r.seq DESC LIMIT 1) r ON TRUE"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [json.dumps(keys)])
        return {EntityKey(ns, kind, slug): load_json(after) for ns, kind, slug, after in cursor}
