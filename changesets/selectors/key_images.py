"""A key-filtered page's whole-image revisions: the creates and deletes that touched it.

A create's (and a delete's) ``changed`` names every top-level member of its
image (API.md "Changed keys"), so a key every entity has (``/name``) matches
every create of its namespace, and such matches are mostly old: entities are
created once and updated for the rest of their lives. The key index
(``revision_changed_keys``) holds them apart from an update's terms (migration
0039) but cannot return them newest first; ``revision_images`` (migration 0040)
returns a namespace's creates and deletes newest first, and a key every entity
has is among the newest of them.

``changesets.selectors.keys._key_revisions`` asks this module for the images
of a page and its ladder for the updates, and merges the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atlas.replicas import read_connection
from changesets.selectors.key_ladder import Cond
from changesets.selectors.rows import REVISION, ROW_COLUMNS, VALUES

_T = REVISION
# The newest whole-image revisions of the namespace a page walks, testing each: a
# few pages' worth. A key most images have (``/name``) fills the page here; one
# they seldom have is the probe's, whose cost is its matches (the walk before it
# is wasted, so it is short: a 3,000-row walk made a page of a key nothing
# touched 4 ms slower at 100k changesets).
IMAGE_WINDOW = 256
# Below the walk, how many of the key's whole-image matches the posting list is
# read for: fewer, and they are the rest of the page's candidates.
IMAGE_PROBE = 20_000
# ``revision_images``' key and its predicate, as migration 0040 spells them (the
# planner matches both), then the names rechecked.
_IMAGES_OF = (
    f"hashtextextended({_T}.branch || chr(31) || {_T}.namespace, 0)"
    " = hashtextextended(%s || chr(31) || %s, 0)"
    f" AND {_T}.op IN ('create', 'delete')"
)
# The key rule on a whole image's terms only (migration 0039 marks them apart):
# the whole rule's terms less an update's.
_IMAGE_RULE = (
    f"atlas_key_terms({_T}.branch, {_T}.namespace, {_T}.changed, {_T}.op)"
    " && ARRAY(SELECT unnest(atlas_key_query(%s, %s, %s))"
    " EXCEPT SELECT unnest(atlas_update_key_query(%s, %s, %s)))"
)


def image_revisions(
    *,
    branch: str,
    namespace: str,
    key: str,
    tests: Cond,
    after: tuple[int, int] | None,
    floor: tuple[int, int] | None,
    top: int | None,
    limit: int,
) -> list[Sequence[Any]]:
    """The newest ``limit`` creates and deletes of ``namespace`` on ``branch`` that
    touched ``key`` (and pass ``tests``: the page's other conditions, SQL on the
    revision table and their parameters), below the position ``after`` and above
    ``floor`` (``(seq, id)``): rows of ``rows.ROW_COLUMNS``, newest first.

    A statement each, each sent only if the one before it came up short:

    - a **walk** of the namespace's newest ``IMAGE_WINDOW`` whole-image revisions
      off ``revision_images``, the key rule tested on each (an ordered subquery
      with its row count as a ``LIMIT``, as ``key_ladder._walk_arm`` and for its
      reasons): a key most entities have fills the page here;
    - a **probe** of the key's whole-image terms below the walk's last row, for
      at most ``IMAGE_PROBE`` matches: fewer, and they are the page's candidates
      (their rows read by :func:`rows_at`);
    - a **walk on** below the window until the page is full, if the probe was
      full (a key in more than ``IMAGE_PROBE`` of the namespace's images, and in
      too few of its newest ``IMAGE_WINDOW``).

    Apart, not arms of one statement: the probe is planned over every partition
    (the key's matches can be anywhere), the walk over those its bounds leave,
    and planning both for every page cost more than running either (4.5 against
    0.7 ms at 10M changesets).

    ``floor``: the caller's page is full down to there from another source (the
    updates), so nothing at or below it can make the page. ``top``: the newest
    seq the page can hold (``bounds.page_top``), if known. Both are literals on
    ``seq`` as well, for the partitions they prune when the statement is planned.
    """
    where, args = _bounds(f"{_T}.seq", after, floor, top)
    sql = _window_sql(tests[0], where)
    width = len(VALUES)
    with read_connection().cursor() as cursor:
        names = [branch, namespace]
        cursor.execute(sql, [*names, *tests[1], *names, *args, limit, limit])
        found = cursor.fetchall()
    if not found or found[-1][0] is not None:
        return [r[:width] for r in found]
    *found, marker = found
    page = [r[:width] for r in found]
    edge = (marker[width + 1], marker[width + 2])
    more = _below_window(branch, namespace, key, tests, edge, after, floor, top, limit - len(page))
    return page + rows_at(more)


def _below_window(
    branch: str,
    namespace: str,
    key: str,
    tests: Cond,
    edge: tuple[int, int],
    after: tuple[int, int] | None,
    floor: tuple[int, int] | None,
    top: int | None,
    need: int,
) -> list[tuple[int, int]]:
    """:func:`image_revisions` below the window's ``edge``: the probe, then, if it
    was full, the walk on; the positions of the newest ``need``."""
    test_sql, test_args = tests
    # The probe's bounds on ``seq + 0``: on ``seq`` the planner could AND in a
    # bitmap of the seq index's range (as ``key_ladder._rung``'s probe).
    late, late_args = _bounds(f"{_T}.seq + 0", after, floor, top)
    probe = (
        f"WITH cand AS MATERIALIZED (SELECT {_T}.seq, {_T}.id FROM {_T} WHERE {_IMAGE_RULE}"
        f" AND ({_T}.seq + 0, {_T}.id) < (%s, %s){late} AND {test_sql}"
        f" LIMIT {IMAGE_PROBE:d})"
        f" SELECT seq, id, (SELECT count(*) FROM cand) >= {IMAGE_PROBE:d} FROM"
        " (SELECT seq, id FROM cand ORDER BY seq DESC, id DESC LIMIT %s) page"
    )
    with read_connection().cursor() as cursor:
        cursor.execute(probe, [*[branch, namespace, key] * 2, *edge, *late_args, *test_args, need])
        found = cursor.fetchall()
        if not found or not found[0][2]:
            return [(seq, rid) for seq, rid, _ in found]
        where, args = _bounds(f"{_T}.seq", edge, floor, top)
        walk_on = (
            f"SELECT {_T}.seq, {_T}.id FROM ({_images(where)} OFFSET 0) {_T}"
            f" WHERE {_T}.branch = %s AND {_T}.namespace = %s AND {test_sql} LIMIT %s"
        )
        cursor.execute(walk_on, [branch, namespace, *args, branch, namespace, *test_args, need])
        return cursor.fetchall()


def rows_at(positions: Sequence[tuple[int, int]]) -> list[Sequence[Any]]:
    """The rows (``rows.ROW_COLUMNS``) at ``positions`` (``(seq, id)``), newest
    first: by the seqs as literals, so the statement is planned over the
    partitions that hold them."""
    if not positions:
        return []
    with read_connection().cursor() as cursor:
        cursor.execute(
            f"SELECT {ROW_COLUMNS} FROM {_T} WHERE {_T}.seq = ANY(%s::int8[])"
            f" AND {_T}.id = ANY(%s::int8[]) ORDER BY 3 DESC, 1 DESC",
            [sorted({s for s, _ in positions}), sorted({i for _, i in positions})],
        )
        wanted = set(positions)
        return [r for r in cursor.fetchall() if (r[2], r[0]) in wanted]


def _images(where: str) -> str:
    """The namespace's whole-image revisions within ``where``, newest first: off
    ``revision_images``, partition by partition (parameters: branch, namespace,
    then ``where``'s)."""
    return f"SELECT * FROM {_T} WHERE {_IMAGES_OF}{where} ORDER BY {_T}.seq DESC, {_T}.id DESC"


def _bounds(
    seq: str, after: tuple[int, int] | None, floor: tuple[int, int] | None, top: int | None
) -> tuple[str, list[Any]]:
    """The page's start and floor as conditions on ``(seq, id)`` and its top (the
    newest seq it can hold) on ``seq`` (``seq`` spelled as given), and their
    parameters. On ``seq`` itself, each bound's seq alone as well: a row
    comparison prunes no partition when the statement is planned. A probe's
    (``seq + 0``) prune nothing: on ``seq``, the planner could AND in a bitmap
    of the seq index's range, which below a cursor, or above the floor of a key
    whose updates are rare, can be most of the log (``key_ladder._rung`` says so too)."""
    sql, args = "", []
    plain = seq == f"{_T}.seq"
    if top is not None:
        sql += f" AND {seq} <= %s"
        args.append(top)
    if after is not None:
        sql += f" AND ({seq}, {_T}.id) < (%s, %s)"
        args += list(after)
        if plain:
            sql += f" AND {seq} <= %s"
            args.append(after[0])
    if floor is not None:
        sql += f" AND ({seq}, {_T}.id) > (%s, %s)"
        args += list(floor)
        if plain:
            sql += f" AND {seq} >= %s"
            args.append(floor[0])
    return sql, args


def _window_sql(test_sql: str, where: str) -> str:
    """:func:`image_revisions`' walk: its rows, each with whether it passed, read
    as far as the page needs; and, when the page came up short under a full
    window, a marker row (no id) with the window's oldest position, the probe's
    top (parameters: branch, namespace, the tests', branch, namespace,
    ``where``'s, the page's size twice)."""
    blanks = ", ".join(["NULL"] * len(VALUES))
    return (
        f"WITH win AS MATERIALIZED (SELECT {ROW_COLUMNS},"
        f" ({_T}.branch = %s AND {_T}.namespace = %s AND {test_sql}) AS hit"
        f" FROM ({_images(where)} LIMIT {IMAGE_WINDOW:d}) {_T}),"
        f" page AS MATERIALIZED (SELECT * FROM win WHERE hit LIMIT %s)"
        f" SELECT *, NULL::int8, NULL::int8 FROM page"
        f" UNION ALL SELECT {blanks}, NULL, edge.seq, edge.id FROM"
        f" (SELECT seq, id FROM win ORDER BY seq, id LIMIT 1) edge"
        f" WHERE (SELECT count(*) FROM page) < %s"
        f" AND (SELECT count(*) FROM win) >= {IMAGE_WINDOW:d}"
        " ORDER BY 3 DESC NULLS LAST, 1 DESC NULLS LAST"
    )
