"""The ladder of a key-filtered page's updates (``GET /revisions?namespace=&key=``).

``changesets.selectors.keys._key_revisions`` reads a page's updates off the
namespace's own newest revisions first; if that comes up short, :func:`below`
goes on from where it stopped. The conditions (what a walk tests on each row,
what a probe asks the key index) are the caller's: ``keys._ladder_tests``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atlas.replicas import read_connection
from changesets.selectors.rows import REVISION, ROW_COLUMNS, VALUES

_T = REVISION
# A condition of the SQL below and its parameters.
Cond = tuple[str, list[Any]]

# How many revisions below a key-filtered page's start its newest-first walk
# covers before the key's posting list is counted (:func:`below`).
KEY_WINDOW = 3000
# How many of the key's matches below the walk the posting list is read for:
# fewer than this, and they are the rest of the page's candidates.
KEY_PROBE = 20_000
# Each rung of the ladder walks and probes this many times as far as the last.
KEY_STEP = 10
# Rungs of (walk, probe) before the last walk, which goes on until the page is full.
KEY_RUNGS = 3


def below(walk: Cond, probe: Cond, after: tuple[int, int], limit: int) -> list[Sequence[Any]]:
    """The newest ``limit`` updates that touched the key below ``after``, in a
    statement per rung of a ladder, each arm run only if those before it came up
    short (``Limit`` over ``Append`` stops pulling once the page is full). A GIN
    index cannot return a key's rows newest first, so the page alternates, rung
    by rung, between the two ways of finding them:

    - a **probe**: the key's matches (an update's terms) below the walks so far,
      off its posting list in ``revision_changed_keys``, at most ``KEY_PROBE``
      (times ``KEY_STEP`` per rung) of them. Fewer than that, and they are all
      there is: the page is their newest, and no later arm runs. The first rung
      is a probe alone (the namespace's walk came before it).
    - a **walk**: the log's revisions newest first off ``revision_seq_entity``,
      the namespace and the key rule tested on each row, over ``KEY_WINDOW``
      times ``KEY_STEP`` revisions below the first rung, then ``KEY_STEP`` times
      as many below that, and so on.

    So a page costs a constant times the cheaper of the two ways: the rows
    between its start and its matches, or the key's matches below its start
    (the last rung's walk alone is unbounded: a key with more than
    ``KEY_PROBE * KEY_STEP ** (KEY_RUNGS - 1)`` matches, none of them within
    ``KEY_WINDOW * (KEY_STEP + ...)`` revisions of the page's start).
    Before the ladder, a key with more than ``KEY_PROBE`` matches below the
    window, all of them old, was walked back to: 33.6 s at 10M revisions for a
    key set by creates only (bench/keys_blame_diff.py, docs/history.md).

    A rung is one statement (:func:`_rung`): its walk, then its probe, the
    probe's candidates and whether the ladder goes on (``open``) materialized
    once. The next rung's statement is sent only if the probe came up full, with
    the rung's bound (``low``, the seq of the revision that many rows down,
    counted index-only along ``revision_seq_entity`` in hops of ``KEY_WINDOW``:
    :func:`_low_by_hops`) as a literal. One statement of every rung cost more
    to plan than most pages cost to run: 5.5 of 9 ms at 10M revisions (ten
    partitions, eleven scans of the table). The probe's columns are spelled
    ``seq + 0`` and leave branch and namespace out (the key's terms name both):
    either would only AND in a bitmap of half the log. The page is
    materialized, its changesets read after it by seq (``rows.with_briefs``):
    joined to an inlined page, the planner (costing the probes it cannot see
    through at millions) read them by a sequential scan per row, 2.6 s at 10M
    revisions for a page it had found in 148 ms.
    """
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
    return rows


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
    rung: int, walk_tests: Cond, after: tuple[int, int], top: int | None, need: int
) -> tuple[list[str], list[Any], str | None, list[Any]]:
    """A rung's bound (``low``, as CTEs and their parameters) and its walk (an arm
    and its parameters; none on the first rung)."""
    walk_sql, walk_params = walk_tests
    if rung == 1:
        # Below the namespace's walk (``by_namespace.walk_revisions``), which read
        # its newest revisions: the probe first, from the page's start.
        return ["low AS MATERIALIZED (SELECT %s::int8 AS s)"], [after[0]], None, []
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
    walk_tests: Cond,
    probe_tests: Cond,
    after: tuple[int, int],
    top: int | None,
    need: int,
) -> tuple[str, list[Any]]:
    """The statement of one rung of :func:`below` and its parameters: the
    walk of the revisions between ``top`` (the page's start on the first rung) and
    the rung's bound, then the probe below the bound (the last rung: an unbounded
    walk), the first ``need`` of their rows, and a marker row if they come up
    short."""
    probe_sql, probe_params = probe_tests
    ctes, cte_args, walk, arm_args = _rung_walk(rung, walk_tests, after, top, need)
    arms = [] if walk is None else [walk]
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
