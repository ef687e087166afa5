"""A changeset's ops as a reader sees them: pages of them, their counts, and a
list page's first few per changeset.

Each reads the revisions by the changeset's seq as well as its id
(:func:`~changesets.selectors.log.revisions_of`), so one partition is read, and
shows a reader only the ops in namespaces she can read (invariant 8) unless she
reads every namespace the changeset touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Count, QuerySet

from changesets.models import Changeset, Revision
from changesets.selectors.log import revisions_of, sees_every_namespace

# Revision columns a changeset's op list needs; the JSON images stay unread.
OP_FIELDS = (
    "id",
    "changeset_id",
    "namespace",
    "kind",
    "slug",
    "op",
    "before_version",
    "after_version",
    "changed",
)


def _visible_revisions(
    changeset: Changeset, namespaces: Sequence[str] | None, *, sees_all: bool
) -> QuerySet[Revision]:
    qs = revisions_of(changeset)
    if not sees_all and namespaces is not None:
        qs = qs.filter(namespace__in=list(namespaces))
    return qs


def changeset_ops(
    *,
    changeset: Changeset,
    namespaces: Sequence[str] | None,
    after_id: int | None = None,
    limit: int,
) -> list[Revision]:
    """One page of the ops the caller may read, in the changeset's op order
    (revision id: the order they were written), after revision ``after_id``.

    Only the columns an op shows are read; the JSON images stay on disk.
    """
    qs = _visible_revisions(
        changeset, namespaces, sees_all=sees_every_namespace(changeset, namespaces)
    )
    if after_id is not None:
        qs = qs.filter(id__gt=after_id)
    return list(qs.only(*OP_FIELDS).order_by("id")[:limit])


def visible_op_counts(
    *, changesets: Sequence[Changeset], namespaces: Sequence[str] | None
) -> dict[Any, int]:
    """Per changeset id, how many of its ops the caller may read (one query at most).

    A changeset the caller reads whole counts ``op_count`` without a query;
    the others count their readable revisions off the ``revision_seq_entity``
    index (by their seqs: :func:`revisions_of`), in one grouped statement.
    """
    counts: dict[Any, int] = {}
    partial: list[Changeset] = []
    for changeset in changesets:
        if sees_every_namespace(changeset, namespaces):
            counts[changeset.id] = changeset.op_count
        else:
            partial.append(changeset)
            counts[changeset.id] = 0
    if partial and namespaces is not None:
        rows = (
            Revision.objects.filter(
                seq__in=[c.seq for c in partial],
                changeset_id__in=[c.id for c in partial],
                namespace__in=list(namespaces),
            )
            .values("changeset_id")
            .annotate(n=Count("id"))
            .values_list("changeset_id", "n")
        )
        counts.update(rows)
    return counts


def first_ops(
    *, changesets: Sequence[Changeset], namespaces: Sequence[str] | None, limit: int
) -> dict[Any, list[Revision]]:
    """Per changeset id, the first ``limit`` ops the caller may read, in op order.

    One statement for the whole page: a ``LATERAL`` subquery per changeset
    with its own ``LIMIT``, so a page of changesets costs at most ``limit``
    rows each to return, however many ops they hold. Each finds its rows by
    the changeset's seq (:func:`revisions_of`): one partition, one index range.
    The page's seqs are given again as a literal list, so the revision table's
    partitions are pruned when the statement is planned: by ``c.seq`` alone
    they are pruned only when it runs, after every partition was planned for
    (1.4 ms of planning at four partitions).
    """
    out: dict[Any, list[Revision]] = {c.id: [] for c in changesets}
    if not changesets:
        return out
    table = Revision._meta.db_table
    columns = ", ".join(f"r.{name}" for name in OP_FIELDS)
    sql = (
        f"SELECT {columns} FROM unnest(%s::uuid[], %s::int8[], %s::boolean[])"
        " AS c(id, seq, whole)"
        f" CROSS JOIN LATERAL (SELECT {columns} FROM {table} r"
        " WHERE r.seq = c.seq AND r.changeset_id = c.id AND r.seq = ANY(%s::int8[])"
        " AND (c.whole OR r.namespace = ANY(%s::text[]))"
        " ORDER BY r.id LIMIT %s) r ORDER BY r.id"
    )
    params = [
        [c.id for c in changesets],
        [c.seq for c in changesets],
        [sees_every_namespace(c, namespaces) for c in changesets],
        sorted({c.seq for c in changesets}),
        list(namespaces or []),
        limit,
    ]
    for revision in Revision.objects.raw(sql, params):
        out[revision.changeset_id].append(revision)
    return out


def changeset_revisions(
    *,
    changeset: Changeset,
    namespaces: Sequence[str] | None,
    after_id: int | None = None,
    limit: int | None = None,
) -> list[Revision]:
    """The revision rows (images included) the caller may read, in op order;
    a page of ``limit`` after revision ``after_id``, or all of them."""
    qs = _visible_revisions(
        changeset, namespaces, sees_all=sees_every_namespace(changeset, namespaces)
    )
    if after_id is not None:
        qs = qs.filter(id__gt=after_id)
    qs = qs.order_by("id")
    return list(qs if limit is None else qs[:limit])
