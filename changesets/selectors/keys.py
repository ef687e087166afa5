"""Key-level reads of the log: history filtered by a pointer, and revisions across a
namespace (blame, which reads ``changed`` too, is ``changesets.selectors.blame``).

Every revision stores its ``changed`` pointers (migration 0013). The key rule
of API.md ("some changed P equals the key, lies inside it, or contains it")
is one array overlap on the GIN index ``revision_changed_keys``:
``atlas_key_terms(branch, namespace, changed, op) && atlas_key_query(branch,
namespace, key)`` (migrations 0013, 0039: index terms and query terms defined side
by side; ``atlas_update_key_query`` asks for an update's terms alone, for blame).
The key ``""`` is the whole document: every revision that changed anything.

Callers pass what the reader may see: these functions filter by branch and
namespace; the namespace's readability is the view's to check (invariant 8).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL

from changesets.archive import boundary
from changesets.models import BASELINE
from changesets.selectors import by_namespace, key_images, key_ladder
from changesets.selectors.bounds import end_of_millisecond, page_bounds, page_top
from changesets.selectors.key_ladder import Cond
from changesets.selectors.rows import (
    HistoryRow,
    with_briefs,
)

_T = "changesets_revision"
# The index expression of ``revision_changed_keys``, spelled as the migration does
# (the planner matches it).
KEY_TERMS = f"atlas_key_terms({_T}.branch, {_T}.namespace, {_T}.changed, {_T}.op)"
# The key rule on that index: its terms overlap the query's (parameters: branch,
# namespace, key).
KEY_RULE = f"{KEY_TERMS} && atlas_key_query(%s, %s, %s)"
# The same on an update's terms alone (migration 0039), and what tells an update.
_UPDATE_RULE = f"{KEY_TERMS} && atlas_update_key_query(%s, %s, %s)"
_UPDATE: Cond = (f"{_T}.op = 'update'", [])


def key_filter(*, branch: str, namespace: str, key: str) -> Q | RawSQL:
    """The key rule as a filter on revisions of ``(branch, namespace)``."""
    if key == "":
        return ~Q(changed=[])
    return RawSQL(KEY_RULE, [branch, namespace, key], output_field=BooleanField())


@dataclass(frozen=True)
class RevisionFilter:
    """``GET /revisions``: one namespace (required), the rest optional."""

    namespace: str
    kind: str | None = None
    key: str | None = None
    author: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def namespace_revisions(
    *,
    where: RevisionFilter,
    branch: str = BASELINE,
    after: tuple[int, int] | None = None,
    limit: int = 50,
) -> list[HistoryRow]:
    """Revisions of one namespace on ``branch``, newest first (seq, then id), after
    the position ``after`` ((seq, id) of the last row of the previous page).

    By namespace (and time) alone, by its newest changesets
    (``by_namespace.newest_revisions``); with a key, :func:`_key_revisions`; else
    (kind or author) by walks of its changesets, :func:`_walked_revisions`. Rows, not
    model instances (:mod:`changesets.selectors.rows`).
    """
    if where.key:
        return _key_revisions(where, branch, after, limit)
    if where.key is None and where.kind is None and where.author is None:
        when = {"since": where.since, "until": where.until}
        return by_namespace.newest_revisions(
            where.namespace, branch=branch, **when, after=after, limit=limit
        )
    return _walked_revisions(where, branch, after, limit)


def _walked_revisions(
    where: RevisionFilter, branch: str, after: tuple[int, int] | None, limit: int
) -> list[HistoryRow]:
    """A page filtered by kind or author (no key): the namespace's own revisions,
    newest first, walked by its changesets (``by_namespace.walk_revisions``), the
    filters tested on each, from where each walk stopped until the page is full or
    the namespace's history ends.

    Its cost follows the namespace's revisions read, never the log's. Read off the
    log's seq index with the namespace as a filter, a page of a namespace of 0.01%
    of the log walked back through the rest of it: 16 ms for ``kind`` and 53 ms for
    ``author`` at 1M changesets in the scale bench's rarest namespace, where the
    text history index that migration 0041 replaced had given the planner the
    namespace's range to read and sort (3.7 and 3.4 ms)."""
    test = _sql_of(_key_conds(where))
    page: list[Sequence[Any]] = []
    position = after
    while len(page) < limit:
        # Each walk starts at the position the last one stopped at: its changesets
        # are bounded by it (the position's own seq included, its cursor ``(seq, id)``
        # keeping what was read), as a page's are by the page's start.
        start = None if position is None else position[0] + 1
        found = page_bounds(since=where.since, until=where.until, before_seq=start)
        if found is None:
            break  # nothing was written in the time window (below the position)
        got, position = by_namespace.walk_revisions(
            where.namespace,
            branch=branch,
            found=found,
            top=page_top(found),
            after=position,
            test=test,
            need=limit - len(page),
        )
        page += got
        if position is None:
            break
    return with_briefs(page[:limit])


# The key rule on one row's ``changed``, for the walks: a changed pointer equal to
# one of the keys or to an ancestor of one (an overlap of two small arrays), or
# inside one (a prefix test). No index matches it, so a walk tests it row by row and
# never trades the walk for a key's whole posting list; and it costs a fraction of
# ``atlas_key_terms``, a PL/pgSQL function building every term of every pointer.
_TOUCHING = (
    f"(string_to_array({_T}.changed, '~2') && %s::text[] OR EXISTS (SELECT 1 FROM"
    f" unnest(string_to_array({_T}.changed, '~2')) AS p"
    " WHERE p ^@ ANY(%s::text[])))"
)


def touching(keys: Sequence[str]) -> tuple[str, list[Any]]:
    """The key rule of API.md for any of ``keys`` (non-empty pointers), tested on a
    revision's ``changed`` (some P equals a key, contains it, or lies inside it), and
    its parameters. The same relation as ``atlas_key_terms && atlas_key_query`` (the
    index's spelling), on escaped pointers alike (tests/changesets/test_key_ladder.py
    compares the two on every pointer shape)."""
    exact: set[str] = set()
    for key in keys:
        cut = len(key)
        while cut > 0:  # the key and its ancestors: "/a/b" -> "/a/b", "/a"
            exact.add(key[:cut])
            cut = key.rfind("/", 0, cut)
    return _TOUCHING, [sorted(exact), [key + "/" for key in keys]]


def _key_revisions(
    where: RevisionFilter, branch: str, after: tuple[int, int] | None, limit: int
) -> list[HistoryRow]:
    """A key-filtered page from two sources, merged newest first: the updates that
    touched the key (:func:`_updates`), and the creates and deletes
    (``key_images``). Apart because a create's ``changed`` names every top-level
    member of its image: a key every entity has matches every create of its
    namespace, and those are old, so a source that reads newest first reads the
    creates of entities made long ago last. Off their own index, newest first,
    such a key's page is among the namespace's newest creates; the updates'
    ladder then asks the key index for an update's terms only (migration 0039).

    The images are asked for only above the page's last update when the updates
    fill it.
    """
    assert where.key
    found = page_bounds(
        since=where.since, until=where.until, before_seq=None if after is None else after[0] + 1
    )
    if found is None:
        return []  # nothing was written in the time window
    # What every source tests besides branch, namespace and op: once for them all.
    base, rule = _key_conds(where), touching([where.key])
    top = page_top(found)
    updates = _updates(where, branch, found, top, after, base, rule, limit)
    floor = (updates[-1][2], updates[-1][0]) if len(updates) >= limit else None
    images = key_images.image_revisions(
        branch=branch,
        namespace=where.namespace,
        key=where.key,
        tests=_sql_of([*base, rule]),
        after=after,
        floor=floor,
        top=top,
        limit=limit,
    )
    page = sorted([*updates, *images], key=lambda r: (r[2], r[0]), reverse=True)
    return with_briefs(page[:limit])


def _updates(
    where: RevisionFilter,
    branch: str,
    found: dict[str, int],
    top: int | None,
    after: tuple[int, int] | None,
    base: list[Cond],
    rule: Cond,
    limit: int,
) -> list[Sequence[Any]]:
    """The newest ``limit`` updates of the page (rows of ``rows.ROW_COLUMNS``): the
    namespace's own newest revisions first (``by_namespace.walk_revisions``: a key
    the namespace's changes often touch is there, whatever other namespaces wrote
    since), then, from where that walk stopped, ``key_ladder.below``. ``base``:
    the page's conditions besides the key rule (:func:`_key_conds`), ``rule``
    the key rule tested row by row (:func:`touching`)."""
    updates, edge = by_namespace.walk_revisions(
        where.namespace,
        branch=branch,
        found=found,
        top=top,
        after=after,
        test=_sql_of([_UPDATE, *base, rule]),
        need=limit,
    )
    if edge is not None:  # below the namespace's walk, within the page's start
        start = edge if after is None else min(after, edge)
        walk, probe = _ladder_tests(where, branch, start, base, rule)
        updates += key_ladder.below(walk, probe, start, limit - len(updates))
    return updates


def _ladder_tests(
    where: RevisionFilter, branch: str, after: tuple[int, int], conds: list[Cond], rule: Cond
) -> tuple[Cond, Cond]:
    """What a walk tests on each row (the key ``rule`` among them), and what a
    probe asks the posting list, below ``after`` and with the page's other
    ``conds``: of updates only (the page's creates and deletes are
    ``key_images``')."""
    assert where.key
    # The walk spells branch and namespace so that no index matches them: a
    # range of an index led by them (``revision_history`` until migration 0041)
    # held every entry of the namespace, seq not leading: a cost that grows with
    # the namespace. The walk must stay a backward walk by seq.
    walk_tests = [
        (f"{_T}.branch || '' = %s", [branch]),
        (f"{_T}.namespace || '' = %s", [where.namespace]),
        _UPDATE,
        *conds,
        rule,
    ]
    probe_tests = [(_UPDATE_RULE, [branch, where.namespace, where.key]), *conds]
    walk_tests.append((f"({_T}.seq, {_T}.id) < (%s, %s)", list(after)))
    probe_tests.append((f"({_T}.seq + 0, {_T}.id) < (%s, %s)", list(after)))
    return _sql_of(walk_tests), _sql_of(probe_tests)


def _sql_of(parts: list[Cond]) -> Cond:
    return " AND ".join(c for c, _ in parts), [p for _, ps in parts for p in ps]


def _key_conds(where: RevisionFilter) -> list[Cond]:
    """What every arm of a key-filtered page tests besides the key rule."""
    conds: list[Cond] = []
    if where.kind is not None:
        conds.append((f"{_T}.kind = %s", [where.kind]))
    if where.author is not None:
        conds.append(
            (
                "EXISTS (SELECT 1 FROM changesets_changeset a"
                f" WHERE a.seq = {_T}.seq AND a.author_name = %s)",
                [where.author],
            )
        )
    if where.since is not None:  # (checked against the archive cut by ``page_bounds``)
        conds.append((f"{_T}.at >= %s", [where.since]))
    if where.until is not None:
        conds.append((f"{_T}.at <= %s", [end_of_millisecond(where.until)]))
    if floor := boundary.floor():
        conds.append((f"{_T}.seq + 0 > %s", [floor]))
    return conds
