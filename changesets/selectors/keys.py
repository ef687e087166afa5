"""Key-level reads of the log: history filtered by a pointer, and revisions across a
namespace (blame, which reads ``changed`` too, is ``changesets.selectors.blame``).

Every revision stores its ``changed`` pointers (migration 0013). The key rule
of API.md ("some changed P equals the key, lies inside it, or contains it")
is one array overlap on the GIN index ``revision_changed_keys``:
``atlas_key_terms(branch, namespace, changed) && atlas_key_query(branch,
namespace, key)`` (both SQL functions of that migration, so the terms the
index holds and the terms a query asks for are defined side by side). The
key ``""`` is the whole document: every revision that changed anything.

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
from changesets.selectors.bounds import end_of_millisecond
from changesets.selectors.rows import (
    AT_MICROS,
    SELECT_ROWS,
    VALUES,
    HistoryRow,
    row_of,
)

_T = "changesets_revision"
# The index expression of ``revision_changed_keys``, spelled as the migration does
# (the planner matches it), overlapping the query's terms (its parameters: branch,
# namespace, key).
KEY_RULE = (
    f"atlas_key_terms({_T}.branch, {_T}.namespace, {_T}.changed) && atlas_key_query(%s, %s, %s)"
)


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

    Without a key, the rows come off the ``revision_seq_entity`` (seq first) or
    ``revision_history`` index, whichever the planner judges cheaper for the
    namespace's share of the log: either way the page reads in proportion to that
    share, not to the log.
    With one, :func:`_key_revisions`. Rows, not model instances
    (:mod:`changesets.selectors.rows`).
    """
    if where.key:
        return _key_revisions(where, branch, after, limit)
    qs = _filtered(where, branch)
    if after is not None:
        seq, rid = after
        qs = qs.filter(Q(seq__lt=seq) | Q(seq=seq, id__lt=rid))
    qs = qs.annotate(at_micros=RawSQL(AT_MICROS, [], output_field=BigIntegerField()))
    rows = qs.order_by("-seq", "-id").values_list(*VALUES)[:limit]
    return [row_of(r) for r in rows]


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
    """A key-filtered page in one statement of arms, each run only if those
    before it came up short (``Limit`` over ``Append`` stops pulling once the
    page is full). A GIN index cannot return a key's rows newest first, so the
    page alternates, rung by rung, between the two ways of finding them:

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

    Each rung's bound (``low_k``, the seq of the revision that many rows down,
    counted index-only along ``revision_seq_entity``, in hops of ``KEY_WINDOW``
    below the first rung: :func:`_low_by_hops`), each probe's candidates
    and whether the ladder goes on (``open_k``) are materialized once; ``CASE``
    keeps a probe from running unless every probe before it came up full. The
    probe's columns are spelled ``seq + 0`` and leave branch and namespace out
    (the key's terms name both): either would only AND in a bitmap of half the
    log. The changeset's columns are joined to the page's rows only, and the
    page is materialized first: inlined, the planner (costing the probes it
    cannot see through at millions) joined the changesets by a sequential scan
    per row, 2.6 s at 10M revisions for a page it had found in 148 ms.
    """
    assert where.key
    rule = [branch, where.namespace, where.key]
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
    probe_tests = [(KEY_RULE, rule), *conds]
    if after is not None:
        walk_tests.append((f"({_T}.seq, {_T}.id) < (%s, %s)", list(after)))
        probe_tests.append((f"({_T}.seq + 0, {_T}.id) < (%s, %s)", list(after)))
    sql, args = _ladder(_sql_of(walk_tests), _sql_of(probe_tests), after, limit)
    with read_connection().cursor() as cursor:
        cursor.execute(sql, args)
        return [row_of(r) for r in cursor.fetchall()]


# A condition of the SQL below and its parameters.
_Cond = tuple[str, list[Any]]


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
                f" WHERE a.id = {_T}.changeset_id AND a.author_name = %s)",
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


def _low(k: int, where: str, rows: int) -> str:
    """``low_k``: the seq of the revision ``rows`` down the seq index from ``where``'s
    top (0 past the oldest), counted index-only along ``revision_seq_entity``."""
    return (
        f"low_{k} AS MATERIALIZED (SELECT COALESCE((SELECT {_T}.seq FROM {_T} {where}"
        f" ORDER BY {_T}.seq DESC OFFSET {rows:d} LIMIT 1), 0) AS s)"
    )


def _low_by_hops(k: int, hops: int) -> str:
    """``low_k`` for a rung below the first: ``hops`` times the seq ``KEY_WINDOW``
    revisions down from the last (from ``low_{k-1}``). The revisions above it are
    at most ``hops * KEY_WINDOW``, each hop's at most ``KEY_WINDOW``, those at a
    hop's own seq counted in the hop that lands there and again in the next.

    One count of ``hops * KEY_WINDOW`` rows down from a subquery's value was
    planned for every row below it (the planner takes a third of each partition
    for a bound it cannot see, fewer rows than the count on a partition of under
    90,000 revisions), so a bitmap of ``revision_seq_entity`` and a sort, or a
    sequential scan and a sort, looked cheaper than the index. A hop reads a
    window's worth, well under that guess, which only the index serves cheaply."""
    return (
        f"low_{k} AS MATERIALIZED (WITH RECURSIVE hop(i, s) AS ("
        f"SELECT 0, (SELECT s FROM low_{k - 1}) UNION ALL"
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


def _ladder(
    walk_tests: _Cond, probe_tests: _Cond, after: tuple[int, int] | None, limit: int
) -> tuple[str, list[Any]]:
    """The statement of walks and probes (:func:`_key_revisions`) and its parameters."""
    ctes: list[str] = []
    arms: list[str] = []
    cte_args: list[Any] = []
    arm_args: list[Any] = []
    walk_sql, walk_params = walk_tests
    probe_sql, probe_params = probe_tests

    def walk(bound: str, gate: str, rows: int | None, args: list[Any]) -> None:
        arms.append(_walk_arm(bound, gate, walk_sql, rows))
        arm_args.extend([*args, *walk_params, limit])

    # low_0: the seq of the KEY_WINDOW-th newest revision below the page's start.
    # The first walk is the revisions above it and below the page's start: at
    # most KEY_WINDOW of them (those at low_0 itself are the first probe's).
    ctes.append(_low(0, "" if after is None else f"WHERE {_T}.seq <= %s", KEY_WINDOW))
    cte_args.extend([] if after is None else [after[0]])
    top = "" if after is None else f" AND ({_T}.seq, {_T}.id) < (%s, %s)"
    walk(f"{_T}.seq > (SELECT s FROM low_0){top}", "", KEY_WINDOW, list(after or ()))
    for k in range(1, KEY_RUNGS + 1):
        cap = KEY_PROBE * KEY_STEP ** (k - 1)
        # The key's matches below the walk so far, at most ``cap``; ``open_k``:
        # every probe so far came up full, so the ladder goes on.
        went_on = "true" if k == 1 else f"(SELECT ok FROM open_{k - 1})"
        ctes.append(
            f"cand_{k} AS MATERIALIZED (SELECT {_T}.id, {_T}.seq FROM {_T}"
            f" WHERE {probe_sql} AND {_T}.seq + 0 <= (SELECT s FROM low_{k - 1})"
            f" LIMIT {cap:d})"
        )
        ctes.append(
            f"open_{k} AS MATERIALIZED (SELECT CASE WHEN {went_on} THEN"
            f" (SELECT count(*) FROM cand_{k}) >= {cap:d} ELSE false END AS ok)"
        )
        cte_args.extend(probe_params)
        arms.append(
            f"(SELECT id, seq FROM cand_{k} WHERE {went_on} AND NOT (SELECT ok FROM open_{k})"
            f" ORDER BY seq DESC, id DESC LIMIT %s)"
        )
        arm_args.append(limit)
        gate = f"(SELECT ok FROM open_{k}) AND "
        below = f"{_T}.seq <= (SELECT s FROM low_{k - 1})"
        if k < KEY_RUNGS:
            # This rung's walk: the revisions above low_k, at most ``rows``; the
            # cap reads as many newest first, low_k's own are cut above it.
            ctes.append(_low_by_hops(k, KEY_STEP**k))
            rows = KEY_WINDOW * KEY_STEP**k
            walk(below, f"{gate}{_T}.seq > (SELECT s FROM low_{k}) AND ", rows, [])
        else:
            walk(below, gate, None, [])
    sql = (
        f"WITH {', '.join(ctes)},"
        f" page AS MATERIALIZED (SELECT * FROM ({' UNION ALL '.join(arms)}) arms LIMIT %s)"
        f" {SELECT_ROWS} JOIN page ON page.id = {_T}.id AND page.seq = {_T}.seq"
        f" ORDER BY {_T}.seq DESC, {_T}.id DESC"
    )
    return sql, [*cte_args, *arm_args, limit]


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
