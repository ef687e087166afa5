"""Time and cursor bounds of the log's pages, as bounds on ``seq``.

``at`` never runs backwards in seq order, so a time is a seq boundary, found
by bisecting seq (``atlas_seq_bound``, migration 0032); a page bounded by time
then starts at its boundary on whichever seq-ordered index serves its other
filters.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.db.models import BigIntegerField, QuerySet
from django.db.models.expressions import RawSQL

from atlas.replicas import read_connection
from changesets import partitions
from changesets.archive import boundary
from changesets.models import LogHead

T = TypeVar("T")
QS = TypeVar("QS", bound="QuerySet[Any, Any]")


def end_of_millisecond(at: datetime) -> datetime:
    """The last microsecond of ``at``'s millisecond.

    Responses show times at milliseconds, so a time a client copies from one
    names its whole millisecond: an upper bound (``until``, ``as_of_time``)
    must include a row stored with microseconds before ``at`` was truncated
    (new rows store milliseconds: ``changesets.services.log_statement.log_clock``).
    """
    return at.replace(microsecond=at.microsecond - at.microsecond % 1000 + 999)


def seq_upto(at: datetime) -> RawSQL:
    """The last seq at or before ``at`` (its whole millisecond), as a subquery.

    ``at`` never runs backwards in seq order (the log statement draws it with
    ``GREATEST`` under the log head's lock), so the changesets at or before a
    time are a prefix of the log, and bisecting seq finds where it ends
    (``atlas_seq_bound``, migration 0032: about 24 probes of the seq index at
    10M changesets). Bounding by seq from there lets every seq-ordered index
    start at the boundary instead of walking back to it from the newest row.
    NULL when nothing is that old (``seq <= NULL`` holds for no row). A scalar
    subquery, so PostgreSQL runs the search once per statement, never per row.
    """
    return _seq_bound(end_of_millisecond(at), upper=True)


def _seq_bound(at: datetime, *, upper: bool) -> RawSQL:
    sql = "(SELECT atlas_seq_bound(%s::timestamptz, %s))"
    return RawSQL(sql, [at, upper], output_field=BigIntegerField())


def page_bounds(
    *, since: datetime | None, until: datetime | None, before_seq: int | None
) -> dict[str, int] | None:
    """A changeset page's bounds as lookups on ``seq`` (``{"lt": 900}``): its time
    window, its cursor and the archive cut's floor. None: no changeset is in the
    time window (the page is empty).

    The time bounds are resolved first, in one statement of their own, and given
    to the page as literals: PostgreSQL then prunes the partitions outside them
    when it plans the page, and estimates each index's range from the real bound.
    As subqueries they were parameters to the planner, each guessed at a third
    of the table: a scoped reader's page since a time long ago (most of the log)
    was planned to read and sort every row of an arm's range (4,137 rows at a
    million changesets) where reading it backwards stops at the page.
    """
    bounds: dict[str, int] = {}
    if since is not None:
        boundary.check_since(since, "since reaches back to the archive cut.", pointer="/since")
    times = resolve(since=since, until=until)
    if times is None:
        return None
    bounds.update(times)
    if before_seq is not None:
        bounds["lt"] = before_seq
    if floor := boundary.floor():
        bounds["gt"] = floor
    return bounds


def resolve(*, since: datetime | None, until: datetime | None) -> dict[str, int] | None:
    """``{"gte": first seq at or after since, "lte": last seq at or before until}``
    for the bounds given, in one statement; None if either has no such seq."""
    if since is None and until is None:
        return {}
    parts, args = [], []
    if since is not None:
        parts.append("atlas_seq_bound(%s::timestamptz, false)")
        args.append(since)
    if until is not None:
        parts.append("atlas_seq_bound(%s::timestamptz, true)")
        args.append(end_of_millisecond(until))
    with read_connection().cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(parts)}", args)
        found = list(cursor.fetchone())
    if any(seq is None for seq in found):
        return None
    bounds: dict[str, int] = {}
    if since is not None:
        bounds["gte"] = int(found.pop(0))
    if until is not None:
        bounds["lte"] = int(found.pop(0))
    return bounds


# A seq bound's lookup (as ``page_bounds`` and ``newest_in_window`` name it) as SQL.
SEQ_OPERATORS = {"lt": "<", "lte": "<=", "gt": ">", "gte": ">="}


def page_top(found: dict[str, int]) -> int | None:
    """The newest seq a page within ``found`` (:func:`page_bounds`) can hold: its
    cursor's, its ``until``'s, else the log head's (the top of
    :func:`newest_in_window`)."""
    tops = [found["lt"] - 1] if "lt" in found else []
    tops += [found["lte"]] if "lte" in found else []
    return min(tops) if tops else log_head_seq()


def log_head_seq() -> int | None:
    """The log head's seq; None without a head row (a log Atlas did not write)."""
    return LogHead.objects.filter(pk=1).values_list("seq", flat=True).first()


def within(qs: QS, window: list[tuple[str, int]]) -> QS:
    """``qs`` within ``window``'s ``(lookup, seq)`` bounds (:func:`newest_in_window`)."""
    return qs.filter(**{f"seq__{lookup}": seq for lookup, seq in window})


def newest_in_window(
    read: Callable[[list[tuple[str, int]], int], list[T]],
    *,
    top: int | None,
    limit: int,
) -> list[T]:
    """A newest-first page of ``limit`` by ``read(window, n)`` (its newest ``n`` rows
    within ``window``, ``(lookup, seq)`` bounds), read first from the newest partition's
    width of seqs at or below ``top`` (the head, or the cursor), then, if that
    comes up short, from below it.

    Why: PostgreSQL plans a scan of every partition a statement may read before
    run-time pruning skips them. A page merged from a reader's namespaces is up to
    five scans of the changeset table, so at ten million changesets (13 partitions)
    its planning cost more than its execution (4.5 ms against 1.4), and a page off
    one index planned in 1-3 ms and ran in a fraction of one. With the window's
    bounds as literals, the first statement is pruned when planned to the one or
    two partitions it spans; a page it cannot fill pays for a second, whole, plan
    (and a read of the head: a trivial statement).
    ``top`` None: no bound known, one read of it all.
    """
    if top is None:
        return read([], limit)
    low = top - partitions.width()
    page = read([("gt", low), ("lte", top)] if low > 0 else [("lte", top)], limit)
    if len(page) < limit and low > 0:
        page += read([("lte", low)], limit - len(page))
    return page
