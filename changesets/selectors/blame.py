"""Blame: for every leaf of an entity's content, the changeset that last set it.

It reads the entity's revisions newest first off ``revision_key`` and their
``changed`` pointers (the rule of API.md, "Key-level history"), never the
images, and stops as soon as every leaf is accounted for. Callers pass what
the reader may see (invariant 8 is the view's to check).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from atlas.replicas import read_connection
from changesets import partitions, pointers
from changesets.archive import boundary
from changesets.models import BASELINE, Revision
from changesets.selectors import bounds, changeset_ids, entity_keys, log
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
    """A revision that touched an open leaf: its changed pointers and changeset."""

    changed: list[str]
    changeset_id: Any
    seq: int
    at: datetime


# What blame reads of a revision (a :class:`_Step`): never its images.
_FIELDS = f"string_to_array({_T}.changed, '~2'), {_T}.changeset_id, {_T}.seq, {_T}.at"


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
       only ``changed``, the changeset and its time, and only the
       revisions that touched a leaf still open: PostgreSQL tests the newest
       revisions' ``changed`` against them (``keys.touching``, the key rule),
       then reads the older ones off the open leaves' posting lists (:func:`_walk`),
       so a busy entity whose oldest leaves date from its create costs a
       window of its revisions and the few that set those leaves, not a walk
       of its history (nor a Python step per revision). The setters' authors
       are read last, for the setters alone.
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
    found: dict[str, _Step] = {}

    def still_open() -> list[str]:
        return [leaf for leaf in order if leaf not in found]

    for step in _history(key, branch, upto_seq, branch_owns_key, still_open):
        for pointer in step.changed:
            for leaf in _touched(pointer, order, found):
                found[leaf] = step
        if len(found) == len(open_leaves):
            break
    # The authors of the setters alone, by their seqs: one statement, pruned to their
    # partitions. A setter archived since it was read is not in the answer: the leaf is
    # reported as set before the cut (``unresolved``).
    briefs = changeset_briefs(setter.seq for setter in found.values())
    return [
        Blame(leaf, setter.changeset_id, setter.seq, briefs[setter.seq][0], setter.at)
        for leaf in open_leaves
        if (setter := found.get(leaf)) is not None and setter.seq in briefs
    ]


def unresolved(content: dict[str, Any], found: Sequence[Blame]) -> list[str]:
    """The leaves of ``content`` blame did not reach (set before an archive cut), sorted."""
    seen = {entry.pointer for entry in found}
    return [leaf for leaf in pointers.leaves(content) if leaf not in seen]


def _touched(pointer: str, order: Sequence[str], found: Container[str]) -> Iterator[str]:
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
    qs = Revision.objects.of_entity(branch, key.namespace, key.kind, key.slug)
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

    First a window of the entity's newest ``ENTITY_KEY_WINDOW`` revisions, each
    tested against the open leaves (``entity_keys.entity_window``), read from the
    newest partition's width of seqs below the top (the bound, or the log head)
    with the bounds as literals, so that it is planned over the one or two
    partitions it spans; if the entity's history went on below that width and
    the window is not full, the rest of it below. Then, if leaves are still open
    below a full window, the updates that touched them off their posting lists
    and the entity's newest create (``entity_keys.entity_probe``), a few rows per
    leaf a statement, at most ``BLAME_BATCH``. Leaves open after the window are
    the ones rarely written, most often those the create set: walked for, the
    busy entity of the scale bench cost a read of all its 18,530 revisions at 1M
    changesets (63 ms, 15,464 buffers).

    One statement of the window and the probe, planned over every partition of
    the table three times, and sent twice (the window's rows of a leaf changed
    every time filled its batch), cost 5-6 ms of planning at ten million
    changesets (13 partitions) against 1.3 ms of execution."""
    entity = log.entity_where(key, branch)
    top = bounds.log_head_seq() if bound is None else bound - 1 if strictly_below else bound
    # The newest partition's width below the top (None: the top is within it of the start).
    lower = top - partitions.width() if top is not None else None
    lower = lower if lower is not None and lower > 0 else None
    size, low, rows = _window(entity, top, lower, still_open())
    yield from rows
    if size < entity_keys.ENTITY_KEY_WINDOW and lower is not None and still_open():
        # The newest partition's width held less than a window: the rest of one below it.
        size, low, rows = _window(entity, lower, None, still_open())
        yield from rows
    if size < entity_keys.ENTITY_KEY_WINDOW:
        return  # the window read the entity's history to its start
    while leaves := still_open():
        batch = min(BLAME_BATCH, 4 * len(leaves) + 16)
        sql, params = entity_keys.entity_probe(
            entity, key, leaves, below=low, branch=branch, limit=batch, columns=_FIELDS
        )
        with read_connection().cursor() as cursor:
            cursor.execute(sql, params)
            rows = [_Step(*row) for row in cursor.fetchall()]
        yield from rows
        if len(rows) < batch:
            return
        low = rows[-1].seq


def _window(
    entity: tuple[str, list[Any]], upper: int | None, lower: int | None, leaves: list[str]
) -> tuple[int, int, list[_Step]]:
    """The window at or below seq ``upper`` and above seq ``lower`` (None: unbounded):
    its size, its oldest seq, and its revisions that touched any of ``leaves``,
    newest first."""
    if not leaves:
        return 0, 0, []
    where, args = entity[0], list(entity[1])
    if upper is not None:
        where += f" AND {_T}.seq <= %s"
        args.append(upper)
    if lower is not None:
        where += f" AND {_T}.seq > %s"
        args.append(lower)
    sql, params = entity_keys.entity_window((where, args), leaves, columns=_FIELDS)
    with read_connection().cursor() as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall()
    size, low = fetched[0][0], fetched[0][1]
    return size, low, [_Step(*row[2:]) for row in fetched if row[2 + 2] is not None]


def branch_holds(*, key: EntityKey, branch: str, changeset_id: Any) -> bool:
    """Whether the entity read under ``branch`` comes from the branch's overlay:
    its last writer (``changeset_id``) is one of the branch's changesets.

    The revision is sought by the changeset's seq as well as its id, found first
    (``changeset_ids.seq_of``: one partition's primary key), so that both
    statements are planned over one partition: ``changeset_id`` alone names
    every partition's index, and the seq as a subquery was planned over every
    partition of both tables."""
    if not branch:
        return False
    seq = changeset_ids.seq_of(changeset_id)
    return (
        seq is not None
        and Revision.objects.filter(
            seq=seq,
            changeset_id=changeset_id,
            namespace=key.namespace,
            kind=key.kind,
            slug=key.slug,
            branch=branch,
        ).exists()
    )
