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

Two shapes:

- :func:`touching` is the predicate, for filters where the page is driven by
  something else (a primary key, a rare rpc, an author) or is a count: the
  planner ORs the three indexes' bitmaps, as it used the one GIN index.
- :func:`newest_touching` is a page newest first: one arm per namespace and
  position, each an ordered index scan cut at the page, then their union, so
  it reads a page's rows per arm, at any depth of the log.

Neither assumes the array is sorted or free of repeats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db.models import F, Q, QuerySet, Value
from django.db.models.lookups import In

from changesets.models import Changeset, namespace_key, text_key

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


def _arms(namespaces: Sequence[str]) -> list[Q]:
    """Predicates whose union is :func:`touching`, each one index's seek; the last
    (the wide batches) is the only one that is not a seek in seq order.

    They overlap (a changeset of two of the names is in two arms): the page is
    their ``UNION``, which drops the repeats. Leaving an earlier arm's rows out
    of a later one instead (``AND namespaces[1] NOT IN …``) misled the planner:
    in a log whose arrays are sorted, a busy namespace at position 2 always
    follows one at position 1, so the exclusion removed every row of an arm it
    had estimated at 2% of the log, and the arm walked the whole seq index
    (1,000,000 rows, 414 ms).
    """
    names = list(namespaces)
    arms = [at_position(p, [name]) for p in range(POSITIONS) for name in names]
    return [*arms, _wide(names)]


def newest_touching(
    qs: QuerySet[Changeset],
    namespaces: Sequence[str],
    *,
    seq_bounds: Mapping[str, Any] | None = None,
    limit: int,
) -> list[Changeset]:
    """The newest ``limit`` changesets of ``qs`` that touched any of ``namespaces``.

    ``qs`` carries the page's other filters (author, rpc, seq bounds); each arm
    gets them too, and its own ``ORDER BY seq DESC LIMIT``, so an arm stops as
    soon as it has a page of its own, and the ``UNION`` sorts at most a page
    per arm. Every changeset of the true page is in its arm's page (fewer than
    ``limit`` of the union are newer, so fewer of the arm's), so the union's
    newest ``limit`` are the page.

    ``seq_bounds``: lookups on ``seq`` (``{"lt": 900}``) that every arm applies.
    """
    if not namespaces:
        return []
    bounds = dict(seq_bounds or {})
    *seeks, wide = _arms(namespaces)
    parts = [
        qs.filter(arm, **{f"seq__{k}": v for k, v in bounds.items()}).order_by("-seq")[:limit]
        for arm in seeks
    ]
    # The wide arm's rows are few, but the planner may not know it (no
    # statistics before PostgreSQL 14), or may find a short seq range cheaper
    # than the GIN index: by ``seq`` it walked the log, or the whole range,
    # looking for them. On ``seq + 0`` (its order and its bounds) no seq index
    # serves it, and it sorts the GIN bitmap's few rows.
    late = qs.alias(late=F("seq") + 0).filter(wide)
    late = late.filter(**{f"late__{k}": v for k, v in bounds.items()})
    parts.append(late.order_by((F("seq") + 0).desc())[:limit])
    merged = parts[0].union(*parts[1:]).order_by("-seq")
    return list(merged[:limit])
