"""Blame: for every leaf of an entity's content, the changeset that last set it.

It reads the entity's revisions newest first off ``revision_history`` and their
``changed`` pointers (the rule of API.md, "Key-level history"), never the
images, and stops as soon as every leaf is accounted for. Callers pass what
the reader may see (invariant 8 is the view's to check).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet, Subquery

from atlas.replicas import read_connection
from changesets import pointers
from changesets.archive import boundary
from changesets.models import BASELINE, Changeset, Revision
from changesets.selectors import entity_keys
from changesets.selectors.rows import REVISION as _T
from changesets.selectors.rows import changeset_briefs
from entities.store import EntityKey

# Revisions read per round trip while blame walks back.
BLAME_BATCH = 200


@dataclass(frozen=True)
class Blame:
    """Who last set one leaf of the content."""

    pointer: str
    changeset_id: Any
    seq: int
    author: str
    at: datetime


@dataclass(frozen=True)
class _Step:
    changed: list[str]
    changeset_id: Any
    seq: int
    at: datetime
    author: str


def blame(
    *,
    content: dict[str, Any],
    key: EntityKey,
    branch: str = BASELINE,
    upto_seq: int | None = None,
    branch_owns_key: bool = False,
) -> list[Blame]:
    """For every leaf of ``content`` (the entity as read), the changeset that last set it.

    1. The leaves: object members recursively; arrays, scalars and empty
       objects or arrays are leaves (``pointers.leaves``).
    2. Walk the entity's revisions newest first (:func:`_history`), reading
       only ``changed`` and the changeset's name and time, and only the
       revisions that touched a leaf still open: PostgreSQL tests the newest
       revisions' ``changed`` against them (``keys.touching``, the key rule),
       then reads the older ones off the open leaves' posting lists (:func:`_walk`),
       so a busy entity whose oldest leaves date from its create costs a
       window of its revisions and the few that set those leaves, not a walk
       of its history (nor a Python step per revision).
    3. A revision whose changed pointer P equals a leaf, contains it, or lies
       inside it (an object emptied) set that leaf's current value: no newer
       revision touched it, and ``changed`` names every difference. The walk
       stops when every leaf is resolved, at the latest at the key's newest
       create, whose ``changed`` holds every top-level member.

    ``upto_seq`` pins the walk (as-of reads); ``branch_owns_key`` says the
    branch's overlay holds the key, so its revisions come first and baseline's
    older than the branch's first write to the key after them. After an archive
    cut the walk ends there: a leaf last set before it is not in the answer
    (the API lists it as archived).
    """
    open_leaves = pointers.leaves(content)
    order = sorted(open_leaves)  # plain string order: a prefix's range is contiguous
    found: dict[str, Blame] = {}

    def still_open() -> list[str]:
        return [leaf for leaf in order if leaf not in found]

    for step in _history(key, branch, upto_seq, branch_owns_key, still_open):
        for pointer in step.changed:
            for leaf in _touched(pointer, order, found):
                found[leaf] = Blame(leaf, step.changeset_id, step.seq, step.author, step.at)
        if len(found) == len(open_leaves):
            break
    return [found[leaf] for leaf in open_leaves if leaf in found]


def unresolved(content: dict[str, Any], found: Sequence[Blame]) -> list[str]:
    """The leaves of ``content`` blame did not reach (set before an archive cut), sorted."""
    seen = {entry.pointer for entry in found}
    return [leaf for leaf in pointers.leaves(content) if leaf not in seen]


def _touched(pointer: str, order: Sequence[str], found: dict[str, Blame]) -> Iterator[str]:
    """The unresolved leaves ``pointer`` equals, contains, or lies inside."""
    start = bisect.bisect_left(order, pointer)
    if start < len(order) and order[start] == pointer and pointer not in found:
        yield pointer
    inside = pointer + "/"
    i = bisect.bisect_left(order, inside)
    while i < len(order) and order[i].startswith(inside):
        if order[i] not in found:
            yield order[i]
        i += 1
    cut = pointer.rfind("/")
    while cut > 0:  # the pointer's ancestors, a leaf when an object was emptied
        ancestor = pointer[:cut]
        j = bisect.bisect_left(order, ancestor)
        if j < len(order) and order[j] == ancestor and ancestor not in found:
            yield ancestor
        cut = pointer.rfind("/", 0, cut)


def _history(
    key: EntityKey,
    branch: str,
    upto_seq: int | None,
    branch_owns_key: bool,
    still_open: Callable[[], list[str]],
) -> Iterator[_Step]:
    """The revisions that made the content as read and touched an open leaf, newest first."""
    bound, strictly_below = upto_seq, False
    if branch_owns_key:
        yield from _walk(key, branch, None, False, still_open)
        # Baseline's part ends below the branch's first write to the key, whether or
        # not that write touched an open leaf.
        first = _revisions(key, branch).order_by("seq").values_list("seq", flat=True)[:1]
        for seq in first:
            bound, strictly_below = seq, True
    yield from _walk(key, BASELINE, bound, strictly_below, still_open)


def _revisions(key: EntityKey, branch: str) -> QuerySet[Revision]:
    qs = Revision.objects.filter(
        branch=branch, namespace=key.namespace, kind=key.kind, slug=key.slug
    )
    if floor := boundary.floor():
        qs = qs.filter(seq__gt=floor)
    return qs


def _walk(
    key: EntityKey,
    branch: str,
    bound: int | None,
    strictly_below: bool,
    still_open: Callable[[], list[str]],
) -> Iterator[_Step]:
    """``branch``'s revisions of ``key`` at or below ``bound`` (below, if ``strictly_below``)
    that touched a leaf still open, newest first.

    Each statement asks for the leaves open when it runs, and for a few rows per
    leaf (every row it returns resolves a leaf, unless an earlier row of the same
    statement resolved it first), at most ``BLAME_BATCH``: the entity's newest
    revisions below the bound walked off ``revision_history``, then, if they
    came up short, the updates below them on the open leaves' posting lists,
    back to the entity's newest create, and that create
    (``entity_keys.entity_walk_then_probe``). Leaves open after
    the walk are the ones rarely written, most often those the create set:
    walked for, the busy entity of the scale bench cost a read of all its
    18,530 revisions at 1M changesets (63 ms, 15,464 buffers); probed on lists
    that held the namespace's creates too, a read of its history and of every
    create (47 ms at 10M)."""
    fields = f"string_to_array({_T}.changed, '~2'), {_T}.changeset_id, {_T}.seq, {_T}.at"
    entity, entity_args = entity_keys.entity_where(key, branch)
    while leaves := still_open():
        where, args = entity, list(entity_args)
        if bound is not None:
            where += f" AND {_T}.seq {'<' if strictly_below else '<='} %s"
            args.append(bound)
        batch = min(BLAME_BATCH, 4 * len(leaves) + 16)
        sql, params = entity_keys.entity_walk_then_probe(
            (where, args), key, leaves, branch=branch, limit=batch, columns=fields
        )
        with read_connection().cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        # The authors by the batch's seqs: one statement, pruned to their partitions.
        briefs = changeset_briefs(row[2] for row in rows)
        for changed, changeset_id, seq, at in rows:
            if seq in briefs:  # (else archived since it was read: ``rows.with_briefs``)
                yield _Step(changed, changeset_id, seq, at, briefs[seq][0])
        if len(rows) < batch:
            return
        bound, strictly_below = rows[-1][2], True


def branch_holds(*, key: EntityKey, branch: str, changeset_id: Any) -> bool:
    """Whether the entity read under ``branch`` comes from the branch's overlay:
    its last writer (``changeset_id``) is one of the branch's changesets.

    The revision is sought by the changeset's seq as well as its id: seq names
    one partition, ``changeset_id`` alone every partition's index."""
    seq = Changeset.objects.filter(pk=changeset_id).values("seq")[:1]
    return (
        bool(branch)
        and Revision.objects.filter(
            seq=Subquery(seq),
            changeset_id=changeset_id,
            namespace=key.namespace,
            kind=key.kind,
            slug=key.slug,
            branch=branch,
        ).exists()
    )
