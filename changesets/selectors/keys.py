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

from django.db.models import BigIntegerField, BooleanField, Q, QuerySet
from django.db.models.expressions import RawSQL

from atlas.replicas import read_connection
from changesets.archive import boundary
from changesets.models import BASELINE, Revision
from changesets.selectors import by_namespace
from changesets.selectors.bounds import end_of_millisecond
from changesets.selectors.rows import (
    AT_MICROS,
    ROW_COLUMNS,
    VALUES,
    HistoryRow,
    bound_changesets,
    with_briefs,
)

_T = "changesets_revision"
# The index expression of ``revision_changed_keys``, spelled as the migration does
# (the planner matches it).
KEY_TERMS = f"atlas_key_terms({_T}.branch, {_T}.namespace, {_T}.changed, {_T}.op)"
# The key rule on that index: its terms overlap the query's (parameters: branch,
# namespace, key).
KEY_RULE = f"{KEY_TERMS} && atlas_key_query(%s, %s, %s)"


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
    (``by_namespace.newest_revisions``); with a key, :func:`_key_revisions`; else off
    the ``revision_seq_entity`` (seq first) or ``revision_history`` index, the
    planner's choice for the namespace's share of the log. Rows, not model
    instances (:mod:`changesets.selectors.rows`).
    """
    if where.key:
        return _key_revisions(where, branch, after, limit)
    if where.key is None and where.kind is None and where.author is None:
        when = {"since": where.since, "until": where.until}
        return by_namespace.newest_revisions(
            where.namespace, branch=branch, **when, after=after, limit=limit
        )
    qs = _filtered(where, branch)
    if after is not None:
        seq, rid = after
        # (``seq <=`` alone too: the OR is no index condition; without it a deep page walked)
        qs = qs.filter(Q(seq__lt=seq) | Q(seq=seq, id__lt=rid), seq__lte=seq)
        if where.author is not None:  # the only filter that joins the changesets
            qs = bound_changesets(qs, seq, op="<=")
    qs = qs.annotate(at_micros=RawSQL(AT_MICROS, [], output_field=BigIntegerField()))
    rows = qs.order_by("-seq", "-id").values_list(*VALUES)[:limit]
    return with_briefs(list(rows))


# How many revisions below a key-filtered page's start its newest-first walk
# covers before the key's posting list is counted (_key_revisions).
KEY_WINDOW = 3000
# How many of the key's matches below the walk the posting list is read for:
# fewer than this, and they are the rest of the page's candidates.
KEY_PROBE = 20_000
# Each rung of the ladder walks and probes this many times as far as the last.
KEY_STEP = 10
# Rungs of (walk, probe) before the last walk, which goes on until the page is full.
KEY_RUNGS = 3
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
    """A key-filtered page in a statement per rung of a ladder, each arm run only
    if those before it came up short (``Limit`` over ``Append`` stops pulling
    once the page is full). A GIN index cannot return a key's rows newest first,
    so the page alternates, rung by rung, between the two ways of finding them:

    - a **walk**: the log's revisions newest first off ``revision_seq_entity``,
      the namespace and the key rule tested on each row, over ``KEY_WINDOW``
      revisions below the page's start, then ``KEY_STEP`` times as many below
      that, and so on. A key changed often fills the page here.
    - a **probe**: the key's matches below the walk so far, off its posting list
      in ``revision_changed_keys``, at most ``KEY_PROBE`` (times ``KEY_STEP``
      per rung) of them. Fewer than that, and they are all there is: the page is
      their newest, and no later arm runs.

    So a page costs a constant times the cheaper of the two ways: the rows
    between its start and its matches, or the key's matches below its start
    (the last rung's walk alone is unbounded: a key with more than
    ``KEY_PROBE * KEY_STEP ** (KEY_RUNGS - 1)`` matches, none of them within
    ``KEY_WINDOW * (1 + KEY_STEP + ...)`` revisions of the page's start).
    Before the ladder, a key with more than ``KEY_PROBE`` matches below the
    window, all of them old, was walked back to: 33.6 s at 10M revisions for a
    key set by creates only (bench/keys_blame_diff.py, docs/history.md).

    A rung is one statement (:func:`_rung`): its walk, then its probe, the
    probe's candidates and whether the ladder goes on (``open``) materialized
    once. The next rung's statement is sent only if the probe came up full, with
    the rung's bound (``low``, the seq of the revision that many rows down,
    counted index-only along ``revision_seq_entity``, in hops of ``KEY_WINDOW``
    below the first rung: :func:`_low_by_hops`) as a literal. One statement of
    every rung cost more to plan than most pages cost to run: 5.5 of 9 ms at
    10M revisions (ten partitions, eleven scans of the table). The
    probe's columns are spelled ``seq + 0`` and leave branch and namespace out
    (the key's terms name both): either would only AND in a bitmap of half the
    log. The page is materialized, its changesets read after it by seq
    (``rows.with_briefs``): joined to an inlined page, the planner (costing the
    probes it cannot see through at millions) read them by a sequential scan per
    row, 2.6 s at 10M revisions for a page it had found in 148 ms.
    """
    assert where.key
    walk, probe = _tests(where, branch, after)
    rows: list[Any] = []
    top: int | None = None  # below the first rung: the last rung's bound, inclusive
    for rung in range(1, KEY_RUNGS + 2):
        sql, args = _rung(rung, walk, probe, after, top, limit - len(rows))
        with read_connection().cursor() as cursor:
            cursor.execute(sql, args)
            fetched = cursor.fetchall()
        # The marker row (no id) closes a page that came up short: whether the
        # probe was full, so the ladder goes on, and the bound it goes on from.
        marker = fetched.pop() if fetched and fetched[-1][0] is None else None
        rows += fetched
        if len(rows) >= limit or marker is None or not marker[-2]:
            break
        top = marker[-1]
    return with_briefs(rows)


# A condition of the SQL below and its parameters.
_Cond = tuple[str, list[Any]]


def _tests(
    where: RevisionFilter, branch: str, after: tuple[int, int] | None
) -> tuple[_Cond, _Cond]:
    """What a walk tests on each row, and what a probe asks the posting list."""
    assert where.key
    conds = _key_conds(where)
    # The walk spells branch and namespace so that no index matches them: the
    # planner, expecting few matches, otherwise read the range out of
    # ``revision_history``, i.e. every entry of the namespace (its seq is not a
    # leading column there): a cost that grows with the namespace.
    walk_tests = [
        (f"{_T}.branch || '' = %s", [branch]),
        (f"{_T}.namespace || '' = %s", [where.namespace]),
        *conds,
        touching([where.key]),
    ]
    probe_tests = [(KEY_RULE, [branch, where.namespace, where.key]), *conds]
    if after is not None:
        walk_tests.append((f"({_T}.seq, {_T}.id) < (%s, %s)", list(after)))
        probe_tests.append((f"({_T}.seq + 0, {_T}.id) < (%s, %s)", list(after)))
    return _sql_of(walk_tests), _sql_of(probe_tests)


def _sql_of(parts: list[_Cond]) -> _Cond:
    return " AND ".join(c for c, _ in parts), [p for _, ps in parts for p in ps]


def _key_conds(where: RevisionFilter) -> list[_Cond]:
    """What every arm of a key-filtered page tests besides the key rule."""
    conds: list[_Cond] = []
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
    if where.since is not None:
        boundary.check_since(
            where.since, "since reaches back to the archive cut.", pointer="/since"
        )
        conds.append((f"{_T}.at >= %s", [where.since]))
    if where.until is not None:
        conds.append((f"{_T}.at <= %s", [end_of_millisecond(where.until)]))
    if floor := boundary.floor():
        conds.append((f"{_T}.seq + 0 > %s", [floor]))
    return conds


def _low(where: str, rows: int) -> str:
    """``low``: the seq of the revision ``rows`` down the seq index from ``where``'s
    top (0 past the oldest), counted index-only along ``revision_seq_entity``."""
    return (
        f"low AS MATERIALIZED (SELECT COALESCE((SELECT {_T}.seq FROM {_T} {where}"
        f" ORDER BY {_T}.seq DESC OFFSET {rows:d} LIMIT 1), 0) AS s)"
    )


def _low_by_hops(hops: int) -> str:
    """``low`` for a rung below the first: ``hops`` times the seq ``KEY_WINDOW``
    revisions down from the last, from the rung's top (a parameter). The revisions above it are
    at most ``hops * KEY_WINDOW``, each hop's at most ``KEY_WINDOW``, those at a
    hop's own seq counted in the hop that lands there and again in the next.

    One count of ``hops * KEY_WINDOW`` rows down from a subquery's value was
    planned for every row below it (the planner takes a third of each partition
    for a bound it cannot see, fewer rows than the count on a partition of under
    90,000 revisions), so a bitmap of ``revision_seq_entity`` and a sort, or a
    sequential scan and a sort, looked cheaper than the index. A hop reads a
    window's worth, well under that guess, which only the index serves cheaply."""
    return (
        "low AS MATERIALIZED (WITH RECURSIVE hop(i, s) AS ("
        "SELECT 0, %s::int8 UNION ALL"
        f" SELECT hop.i + 1, COALESCE((SELECT {_T}.seq FROM {_T} WHERE {_T}.seq <= hop.s"
        f" ORDER BY {_T}.seq DESC OFFSET {KEY_WINDOW:d} LIMIT 1), 0)"
        f" FROM hop WHERE hop.i < {hops:d} AND hop.s > 0)"
        f" SELECT s FROM hop ORDER BY i DESC LIMIT 1)"
    )


def _walk_arm(bound: str, gate: str, tests: str, rows: int | None) -> str:
    """A walk over at most ``rows`` revisions newest first from ``bound``'s top
    (all of them if None), as an ordered stream: the seq index read newest first
    in a subquery (its LIMIT, or OFFSET 0, keeps the tests out of it), the tests
    on each row above it, the first ``limit`` kept, with no ORDER BY there (the
    subquery's order is the page's, ids sorted within each seq as they stream).

    The LIMIT is what makes the plan a walk. The planner expects almost no row
    to pass the tests, so it costs the subquery for every row it can return;
    bounded only by a subquery (``low_k``) that is a third of each partition,
    and a bitmap of ``revision_seq_entity`` and a sort, or a sequential scan of
    the partition and a sort, could look cheaper than the index (it did, in
    ``test_scale_plans``, once a few seeded logs had been rolled back). Capped at
    the window's row count, reading the index newest first is the cheap plan for
    any guess of the range above the cap. An ORDER BY outside would plan the
    subquery for every row again and sort what passed the tests after reading
    them all."""
    cut = "OFFSET 0" if rows is None else f"LIMIT {rows:d}"
    return (
        f"(SELECT {_T}.id, {_T}.seq FROM (SELECT * FROM {_T} WHERE {bound}"
        f" ORDER BY {_T}.seq DESC, {_T}.id DESC {cut}) {_T}"
        f" WHERE {gate}{tests} LIMIT %s)"
    )


def _rung_walk(
    rung: int, walk_tests: _Cond, after: tuple[int, int] | None, top: int | None, need: int
) -> tuple[list[str], list[Any], str, list[Any]]:
    """A rung's bound (``low``, as CTEs and their parameters) and its walk (an arm
    and its parameters)."""
    walk_sql, walk_params = walk_tests
    if rung == 1:
        # low: the seq of the KEY_WINDOW-th newest revision below the page's start.
        # The walk is the revisions above it and below the page's start: at most
        # KEY_WINDOW of them (those at low itself are the probe's).
        where = "" if after is None else f"WHERE {_T}.seq <= %s"
        upper = "" if after is None else f" AND ({_T}.seq, {_T}.id) < (%s, %s)"
        arm = _walk_arm(f"{_T}.seq > (SELECT s FROM low){upper}", "", walk_sql, KEY_WINDOW)
        return (
            [_low(where, KEY_WINDOW)],
            [] if after is None else [after[0]],
            arm,
            [*(after or ()), *walk_params, need],
        )
    if rung <= KEY_RUNGS:
        # The revisions above low, at most ``rows``: the cap reads as many newest
        # first from the top, low's own are cut above it.
        rows = KEY_WINDOW * KEY_STEP ** (rung - 1)
        gate = f"{_T}.seq > (SELECT s FROM low) AND "
        arm = _walk_arm(f"{_T}.seq <= %s", gate, walk_sql, rows)
        return [_low_by_hops(KEY_STEP ** (rung - 1))], [top], arm, [top, *walk_params, need]
    return [], [], _walk_arm(f"{_T}.seq <= %s", "", walk_sql, None), [top, *walk_params, need]


def _rung(
    rung: int,
    walk_tests: _Cond,
    probe_tests: _Cond,
    after: tuple[int, int] | None,
    top: int | None,
    need: int,
) -> tuple[str, list[Any]]:
    """The statement of one rung of :func:`_key_revisions` and its parameters: the
    walk of the revisions between ``top`` (the page's start on the first rung) and
    the rung's bound, then the probe below the bound (the last rung: an unbounded
    walk), the first ``need`` of their rows, and a marker row if they come up
    short."""
    probe_sql, probe_params = probe_tests
    ctes, cte_args, walk, arm_args = _rung_walk(rung, walk_tests, after, top, need)
    arms = [walk]
    marker = ""
    if rung <= KEY_RUNGS:
        # The key's matches below the walk, at most ``cap``; ``open``: as many as
        # that, so the page's candidates may be further down.
        cap = KEY_PROBE * KEY_STEP ** (rung - 1)
        ctes.append(
            f"cand AS MATERIALIZED (SELECT {_T}.id, {_T}.seq FROM {_T}"
            f" WHERE {probe_sql} AND {_T}.seq + 0 <= (SELECT s FROM low) LIMIT {cap:d})"
        )
        ctes.append(f"open AS MATERIALIZED (SELECT (SELECT count(*) FROM cand) >= {cap:d} AS ok)")
        cte_args.extend(probe_params)
        arms.append(
            "(SELECT id, seq FROM cand WHERE NOT (SELECT ok FROM open)"
            " ORDER BY seq DESC, id DESC LIMIT %s)"
        )
        arm_args.append(need)
        blanks = ", ".join(["NULL"] * len(VALUES))
        marker = (
            f" UNION ALL SELECT {blanks}, (SELECT ok FROM open), (SELECT s FROM low)"
            f" WHERE (SELECT count(*) FROM page) < {need:d}"
        )
    sql = (
        f"WITH {', '.join(ctes)}{',' if ctes else ''}"
        f" page AS MATERIALIZED (SELECT * FROM ({' UNION ALL '.join(arms)}) arms LIMIT %s)"
        f" SELECT {ROW_COLUMNS}, NULL::bool, NULL::int8 FROM {_T}"
        f" JOIN page ON page.id = {_T}.id AND page.seq = {_T}.seq{marker}"
        " ORDER BY 3 DESC NULLS LAST, 1 DESC NULLS LAST"
    )
    return sql, [*cte_args, *arm_args, need]


def _filtered(where: RevisionFilter, branch: str) -> QuerySet[Revision]:
    qs = Revision.objects.filter(branch=branch, namespace=where.namespace)
    if where.key is not None:
        qs = qs.filter(key_filter(branch=branch, namespace=where.namespace, key=where.key))
    if where.kind is not None:
        qs = qs.filter(kind=where.kind)
    if where.author is not None:
        qs = qs.filter(changeset__author_name=where.author)
    if where.since is not None:
        boundary.check_since(
            where.since, "since reaches back to the archive cut.", pointer="/since"
        )
        qs = qs.filter(at__gte=where.since)
    if where.until is not None:
        qs = qs.filter(at__lte=end_of_millisecond(where.until))
    if floor := boundary.floor():
        qs = qs.filter(seq__gt=floor)
    return qs
