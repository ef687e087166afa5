"""Changesets by the namespaces they touched, in the shapes the log's indexes serve.

A changeset's ``namespaces`` is an array; migration 0037 indexes it by position
(issue 18): ``changeset_ns1_seq`` on ``(key of namespaces[1], seq)`` holds every
changeset, ``changeset_ns2_seq`` on ``(key of namespaces[2], seq)`` those that
touched two namespaces or more, and ``changeset_ns3_more`` (GIN) those that
touched three or more. The key is the name's hash
(:func:`~changesets.models.namespace_key`); every query rechecks the name.
A namespace's changesets newest first are then two backward seeks and a
bitmap of the few wide batches, where one GIN index over every changeset had
to hand over the namespace's whole history to be sorted.

Two shapes of changesets, and a page of revisions:

- :func:`touching` is the predicate, for filters where the page is driven by
  something else (a primary key, a rare rpc, an author) or is a count: the
  planner ORs the three indexes' bitmaps, as it used the one GIN index.
- :func:`newest_touching` is a page newest first: one arm per namespace and
  position, each an ordered index scan cut at the page, then their union, so
  it reads a page's rows per arm, at any depth of the log.
- :func:`newest_revisions` is a page of a namespace's revisions newest first,
  by its newest changesets.

Neither assumes the array is sorted or free of repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import Q, Value
from django.db.models.lookups import In

from atlas.replicas import read_connection
from changesets import partitions
from changesets.models import Changeset, namespace_key, text_key
from changesets.selectors import bounds, rows
from changesets.selectors.rows import HistoryRow

# Positions of ``namespaces`` with a B-tree ordered by seq (migration 0037).
POSITIONS = 2
# Most namespaces a page merges arms for. Each namespace is two arms, each reads
# up to a page, and Django builds each as a queryset: at 8 namespaces a page
# cost 8.7 ms in PostgreSQL and as much again in Python, at 60 namespaces 15 ms
# and 100 ms, where the seq index read backwards with :func:`touching` as a
# filter costs a fraction of a millisecond for a reader whose namespaces are
# busy together. A reader of more namespaces than this gets that
# (``changeset_list``): the plan the GIN index gave before migration 0037.
MERGE_MOST = 4


def at_position(position: int, names: Sequence[str]) -> Q:
    """``namespaces[position + 1]`` is one of ``names``: the position index's seek on
    the names' keys, and the names rechecked (two names may share a hash)."""
    keys = In(namespace_key(position), [text_key(Value(name)) for name in names])
    return Q(keys) & Q(**{f"namespaces__{position}__in": list(names)})


def _wide(names: list[str]) -> Q:
    """A changeset of three namespaces or more, one of them in ``names``: the only
    ones ``changeset_ns3_more`` holds."""
    return Q(namespaces__2__isnull=False, namespaces__overlap=names)


def touching(namespaces: Sequence[str]) -> Q:
    """Changesets that touched any of ``namespaces``: ``namespaces && {…}`` as the
    indexes can answer it (the GIN index covers only arrays of three or more)."""
    names = list(namespaces)
    return at_position(0, names) | at_position(1, names) | _wide(names)


def newest_touching(
    namespaces: Sequence[str],
    *,
    branch: str | None = None,
    seq_bounds: Sequence[tuple[str, int]] = (),
    window: Sequence[tuple[str, int]] = (),
    limit: int,
) -> list[Changeset]:
    """The newest ``limit`` changesets (of ``branch``, if given) that touched any of
    ``namespaces``, within ``seq_bounds`` and ``window``: ``(lookup, seq)`` pairs
    (``("lt", 900)``), which every arm applies. ``window``'s are on ``seq`` itself
    in every arm, the wide one too, so that they prune partitions when the
    statement is planned (``bounds.newest_in_window``).

    Each arm gets its own ``ORDER BY seq DESC LIMIT``, so it stops as soon as it
    has a page of its own, and the ``UNION`` sorts at most a page per arm. Every
    changeset of the true page is in its arm's page (fewer than ``limit`` of the
    union are newer, so fewer of the arm's), so the union's newest ``limit`` are
    the page.

    The arms overlap (a changeset of two of the names is in two): the ``UNION``
    drops the repeats. Leaving an earlier arm's rows out of a later one instead
    (``AND namespaces[1] NOT IN …``) misled the planner: in a log whose arrays are
    sorted, a busy namespace at position 2 always follows one at position 1, so
    the exclusion emptied an arm it had estimated at 2% of the log, and the arm
    walked the whole seq index (1,000,000 rows, 414 ms).

    The statement is written here, not built as a union of querysets: Django took
    4 ms to build and compile the five arms of a reader of two namespaces, more
    than PostgreSQL took to plan and run them. The arms are :func:`touching`'s
    parts in the SQL Django wrote for them (the position indexes' expressions,
    the wide arm's array cast); tests/changesets/test_namespace_seeks.py compares
    the pages with the array overlap itself.
    """
    names = list(dict.fromkeys(namespaces))
    if not names:
        return []
    sql, args = _newest_sql(_columns(), names, branch, seq_bounds, window, limit)
    return list(Changeset.objects.raw(sql, args))


def _newest_sql(
    columns: str,
    names: list[str],
    branch: str | None,
    seq_bounds: Sequence[tuple[str, int]],
    window: Sequence[tuple[str, int]],
    limit: int,
) -> tuple[str, list[Any]]:
    """:func:`newest_touching`'s statement over ``columns``, and its parameters."""
    on_seq, seq_args = _bounds("seq", branch, [*seq_bounds, *window])
    arms: list[str] = []
    args: list[Any] = []
    for position in range(1, POSITIONS + 1):
        element = f"namespaces[{position}]"
        for name in names:
            arms.append(
                f"(SELECT {columns} FROM changesets_changeset"
                f" WHERE hashtextextended({element}, 0) = hashtextextended(%s::text, 0)"
                f" AND {element} = %s{on_seq} ORDER BY seq DESC LIMIT %s)"
            )
            args += [name, name, *seq_args, limit]
    wide, wide_args = _wide_arm(columns, names, branch, seq_bounds, window, limit)
    arms.append(wide)
    args += wide_args
    return f"{' UNION '.join(arms)} ORDER BY seq DESC LIMIT %s", [*args, limit]


def _wide_arm(
    columns: str,
    names: list[str],
    branch: str | None,
    seq_bounds: Sequence[tuple[str, int]],
    window: Sequence[tuple[str, int]],
    limit: int,
) -> tuple[str, list[Any]]:
    """The arm of the changesets of three namespaces or more (``changeset_ns3_more``).

    Its rows are few, but the planner may not know it (no statistics before
    PostgreSQL 14), or may find a short seq range cheaper than the GIN index: by
    ``seq`` it walked the log, or the whole range, looking for them. On ``seq + 0``
    (its order and its bounds) no seq index serves it, and it sorts the GIN
    bitmap's few rows. The window is on ``seq`` itself, for the partitions it
    prunes: at most a partition's width, and an index on ``seq`` cannot give the
    arm its order (``seq + 0``), so no walk of it is cheaper than the bitmap.
    """
    on_late, late_args = _bounds("seq + 0", branch, seq_bounds)
    in_window, window_args = _bounds("seq", None, window)
    sql = (
        f"(SELECT {columns} FROM changesets_changeset"
        f" WHERE namespaces[{POSITIONS + 1}] IS NOT NULL"
        f" AND namespaces && %s::varchar(200)[]{on_late}{in_window}"
        " ORDER BY seq + 0 DESC LIMIT %s)"
    )
    return sql, [names, *late_args, *window_args, limit]


def _bounds(
    column: str, branch: str | None, seq_bounds: Sequence[tuple[str, int]]
) -> tuple[str, list[Any]]:
    """`` AND``-joined conditions on ``column`` (seq, or an expression of it) and
    the branch, and their parameters."""
    sql = ""
    args: list[Any] = []
    if branch is not None:
        sql += " AND branch = %s"
        args.append(branch)
    for lookup, seq in seq_bounds:
        sql += f" AND {column} {bounds.SEQ_OPERATORS[lookup]} %s"
        args.append(int(seq))
    return sql, args


def _columns() -> str:
    """Every column of the changeset, as :meth:`Changeset.objects.raw` loads it."""
    return ", ".join(str(f.column) for f in Changeset._meta.concrete_fields)


def newest_revisions(
    namespace: str,
    *,
    branch: str,
    since: datetime | None,
    until: datetime | None,
    after: tuple[int, int] | None,
    limit: int,
) -> list[HistoryRow]:
    """``GET /revisions?namespace=`` by namespace (and time) alone, newest first
    (seq, then id), after the position ``after``: the namespace's newest changesets
    on ``branch`` (:func:`newest_touching`'s arms), and their revisions in it, in one
    statement (:func:`_revisions_of_newest`).

    Every such changeset holds at least one of the page's rows, so ``limit`` of
    them, and one more for the cursor's own (its rows may all be on the previous
    page), hold the page: it reads about a page of index entries at any share of
    the log. Read off the log's seq index with the namespace as a filter, a rare
    namespace's page walked the log back to its fiftieth revision; off
    ``revision_history``, it read every revision of the namespace and sorted them
    (2.3 ms at 100k changesets, 8.0 ms at 10M, for a namespace of 0.02%). The
    page is read within a partition's width below its top first
    (``bounds.newest_in_window``), the bounds literals in both tables' arms, so
    that it is planned over the partitions they span."""
    found = bounds.page_bounds(
        since=since, until=until, before_seq=None if after is None else after[0] + 1
    )
    if found is None:
        return []  # nothing was written in the time window

    def read(window: list[tuple[str, int]], n: int) -> list[Sequence[Any]]:
        return _revisions_of_newest(namespace, branch, list(found.items()), window, after, n)

    width = len(rows.VALUES)
    page = bounds.newest_in_window(read, top=bounds.page_top(found), limit=limit)
    return [rows.row_of(r[:width], r[width:]) for r in page]


def _revisions_of_newest(
    namespace: str,
    branch: str,
    seq_bounds: list[tuple[str, int]],
    window: list[tuple[str, int]],
    after: tuple[int, int] | None,
    limit: int,
) -> list[Sequence[Any]]:
    """The newest ``limit`` revisions of ``namespace`` on ``branch`` within
    ``seq_bounds`` and ``window`` (as :func:`newest_touching` takes them) and after
    ``after``, as rows of ``rows.ROW_COLUMNS`` and their changeset's author, rpc and
    comment."""
    cs_sql, cs_args = _newest_sql(
        "seq, author_name, rpc, comment", [namespace], branch, seq_bounds, window, limit + 1
    )
    revision = rows.REVISION
    # The bounds are literals on this table too: its partitions are pruned when planned.
    on_seq, seq_args = _bounds(f"{revision}.seq", None, [*seq_bounds, *window])
    cursor_sql = "" if after is None else f" AND ({revision}.seq, {revision}.id) < (%s, %s)"
    # LATERAL: each changeset's revisions are one seek of ``revision_seq_entity``
    # (seq first), whatever the planner makes of the namespace's size (its
    # ``OFFSET 0`` keeps the subquery from being pulled up into a join). Joined,
    # it hashed every revision of the namespace below the cursor (a table of a
    # few thousand rows in the tests).
    sql = (
        f"WITH cs AS MATERIALIZED ({cs_sql})"
        f" SELECT {rows.ROW_COLUMNS}, cs.author_name, cs.rpc, cs.comment FROM cs"
        f" CROSS JOIN LATERAL (SELECT * FROM {revision} WHERE {revision}.seq = cs.seq"
        f" AND {revision}.branch = %s AND {revision}.namespace = %s{on_seq}{cursor_sql}"
        f" OFFSET 0) {revision}"
        f" ORDER BY {revision}.seq DESC, {revision}.id DESC LIMIT %s"
    )
    args = [*cs_args, branch, namespace, *seq_args, *(after or ()), limit]
    with read_connection().cursor() as cursor:
        cursor.execute(sql, args)
        return cursor.fetchall()


# A namespace's changesets a key-filtered walk reads at most (:func:`walk_revisions`),
# and their revisions it tests at most. About a page: read for more, the planner
# took a namespace of a few percent's newest changesets off the log's seq index,
# testing each (as it does for a page, where that is the cheap plan), and a
# thousand of them were 33,000 rows at a million changesets.
WALK_CHANGESETS = 64
WALK_REVISIONS = 3000


def walk_revisions(
    namespace: str,
    *,
    branch: str,
    found: dict[str, int],
    top: int | None,
    after: tuple[int, int] | None,
    test: tuple[str, list[Any]],
    need: int,
) -> tuple[list[Sequence[Any]], tuple[int, int] | None]:
    """The newest ``need`` revisions of ``namespace`` on ``branch`` that pass ``test``
    (SQL on the revision table, and its parameters), within ``found``
    (:func:`bounds.page_bounds`; ``top``: the newest seq within them,
    :func:`bounds.page_top`) and after the position ``after``, walked newest
    first by the namespace's own changesets: rows of ``rows.ROW_COLUMNS``, and
    where the walk stopped short of the page: None if it did not (the page is
    full, or it read every revision there was), else the position ``(seq, id)``
    below which it did not look (the caller goes on from there; ids are
    positive, so ``(seq, 0)`` is "below seq").

    The walk reads the namespace's newest ``WALK_CHANGESETS`` changesets on the
    branch within a partition's width below the page's top (the arms of
    :func:`newest_touching`, the bounds literals, so that the statement is
    planned over the partitions they span), then their revisions in the
    namespace, one seek each, testing each, and stops at the page or at
    ``WALK_REVISIONS`` revisions. Why: a key that the namespace's changes often
    touch is found among its newest revisions, however many other namespaces
    wrote since, where a walk of the log's newest revisions read whatever was
    written elsewhere first (``keys._key_revisions`` goes on from where it stopped).
    """
    low = 0 if top is None else top - partitions.width()
    window: list[tuple[str, int]] = []
    if top is not None and low > 0:
        window = [("gt", low), ("lte", top)]
    sql, args = _walk_sql(namespace, branch, [*found.items()], window, after, test, need)
    with read_connection().cursor() as cursor:
        cursor.execute(sql, args)
        fetched = cursor.fetchall()
    width = len(rows.VALUES)
    marker = fetched.pop() if fetched and fetched[-1][0] is None else None
    page = [r[:width] for r in fetched]
    if marker is None:
        return page, None
    changesets, oldest_changeset, walked, last_seq, last_id = marker[width:]
    if walked >= WALK_REVISIONS:  # it stopped at a revision (maybe inside a changeset)
        return page, (last_seq, last_id)
    if changesets >= WALK_CHANGESETS:  # at a changeset, all of whose revisions it read
        return page, (oldest_changeset, 0)
    if window:  # at the window's floor
        return page, (low + 1, 0)
    return page, None


def _walk_sql(
    namespace: str,
    branch: str,
    seq_bounds: list[tuple[str, int]],
    window: list[tuple[str, int]],
    after: tuple[int, int] | None,
    test: tuple[str, list[Any]],
    need: int,
) -> tuple[str, list[Any]]:
    """:func:`walk_revisions`' statement and its parameters.

    ``walk`` is evaluated as far as ``page`` reads it: a page of a key every
    change touches stops after its rows. The marker row (no id), only when the
    page came up short, says how far the walk read: its changesets and their
    oldest seq, its revisions and the oldest position among them."""
    cs_sql, cs_args = _newest_sql("seq", [namespace], branch, seq_bounds, window, WALK_CHANGESETS)
    revision = rows.REVISION
    on_seq, seq_args = _bounds(f"{revision}.seq", None, [*seq_bounds, *window])
    cursor_sql = "" if after is None else f" AND ({revision}.seq, {revision}.id) < (%s, %s)"
    test_sql, test_args = test
    blanks = ", ".join(["NULL"] * len(rows.VALUES))
    sql = (
        f"WITH cs AS MATERIALIZED ({cs_sql}),"
        f" walk AS MATERIALIZED (SELECT w.id, w.seq, w.hit FROM cs CROSS JOIN LATERAL"
        f" (SELECT {revision}.id, {revision}.seq, ({test_sql}) AS hit FROM {revision}"
        f" WHERE {revision}.seq = cs.seq AND {revision}.branch = %s"
        f" AND {revision}.namespace = %s{on_seq}{cursor_sql}"
        f" ORDER BY {revision}.id DESC OFFSET 0) w LIMIT {WALK_REVISIONS:d}),"
        f" page AS MATERIALIZED (SELECT id, seq FROM walk WHERE hit LIMIT %s)"
        f" SELECT {rows.ROW_COLUMNS}, {', '.join(['NULL::int8'] * 5)}"
        f" FROM {revision} JOIN page ON page.id = {revision}.id AND page.seq = {revision}.seq"
        f"{on_seq}"
        f" UNION ALL SELECT {blanks}, (SELECT count(*) FROM cs), (SELECT min(seq) FROM cs),"
        " (SELECT count(*) FROM walk), last.seq, last.id"
        " FROM (SELECT NULL) one LEFT JOIN (SELECT seq, id FROM walk ORDER BY seq, id LIMIT 1)"
        " last ON true WHERE (SELECT count(*) FROM page) < %s"
        " ORDER BY 3 DESC NULLS LAST, 1 DESC NULLS LAST"
    )
    args = [*cs_args, *test_args, branch, namespace, *seq_args, *(after or ()), need]
    return sql, [*args, *seq_args, need]
