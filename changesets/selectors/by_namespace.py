"""Changesets by the namespaces they touched, in the shapes the log's indexes serve.

A changeset's ``namespaces`` is an array; migration 0037 indexes it by position
(issue 18): ``changeset_ns1_seq`` on ``(namespaces[1], seq)`` holds every
changeset, ``changeset_ns2_seq`` on ``(namespaces[2], seq)`` those that touched
two namespaces or more, and ``changeset_ns3_more`` (GIN) those that touched three
or more. A namespace's changesets newest first are then two backward seeks and
a bitmap of the few wide batches, merged in seq order, where one GIN index over
every changeset had to hand over the namespace's whole history to be sorted.

Two shapes:

- :func:`touching` is the predicate, for filters where the page is driven by
  something else (a primary key, a rare rpc, an author) or is a count: the
  planner ORs the three indexes' bitmaps, as it used the one GIN index.
- :func:`newest_touching` is a page newest first: one arm per namespace and
  position, each an ordered index scan, merged by PostgreSQL (``Merge Append``)
  and cut at the page, so it reads the page's rows and a few more, at any depth
  of the log.

Neither assumes the array is sorted or free of repeats: each arm but the
first leaves out what an earlier one returns.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import F, Q, QuerySet

from changesets.models import Changeset

# Positions of ``namespaces`` with a B-tree ordered by seq (migration 0037).
POSITIONS = 2


def touching(namespaces: Sequence[str]) -> Q:
    """Changesets that touched any of ``namespaces``: ``namespaces && {…}`` as the
    indexes can answer it (the GIN index covers only arrays of three or more)."""
    names = list(namespaces)
    found = Q(namespaces__0__in=names) | Q(namespaces__1__in=names)
    return found | Q(namespaces__2__isnull=False, namespaces__overlap=names)


def _arms(namespaces: Sequence[str]) -> list[Q]:
    """Disjoint predicates whose union is :func:`touching`, each one index's seek."""
    names = list(namespaces)
    arms: list[Q] = []
    for position in range(POSITIONS):
        earlier = Q()
        for before in range(position):
            earlier |= Q(**{f"namespaces__{before}__in": names})
        for name in names:
            arms.append(Q(**{f"namespaces__{position}": name}) & ~earlier)
    # (Three positions or more: each of those holds a name at 0 or 1 or is here.)
    wide = Q(namespaces__2__isnull=False, namespaces__overlap=names)
    for before in range(POSITIONS):
        wide &= ~Q(**{f"namespaces__{before}__in": names})
    arms.append(wide)
    return arms


def newest_touching(
    qs: QuerySet[Changeset], namespaces: Sequence[str], *, limit: int
) -> list[Changeset]:
    """The newest ``limit`` changesets of ``qs`` that touched any of ``namespaces``.

    ``qs`` carries the page's other filters (author, rpc, seq bounds); each arm
    gets them too, and its own ``ORDER BY seq DESC LIMIT``, so an arm stops as
    soon as it has a page of its own. (Without the arms' limits PostgreSQL 15
    and 16 plan a top-level ``UNION ALL`` as an Append under one Sort, never a
    Merge Append of ordered scans: every arm read to its end.)
    """
    if not namespaces:
        return []
    *seeks, wide = _arms(namespaces)
    parts = [qs.filter(arm).order_by("-seq")[:limit] for arm in seeks]
    # The wide arm's rows are few, but the planner cannot tell (no statistics
    # describe ``namespaces[3]``): ordered by ``seq``, it walked the whole log
    # backwards looking for them. ``seq + 0`` leaves it the GIN bitmap to sort.
    parts.append(qs.filter(wide).order_by((F("seq") + 0).desc())[:limit])
    merged = parts[0].union(*parts[1:], all=True).order_by("-seq")
    return list(merged[:limit])
