"""Reads of the changeset log: history, lists, single changesets.

Every function takes the caller's readable namespaces (``None`` = all) and
filters by them, so visibility is decided in one place per query.

After an archive cut (``changesets.archive.boundary``) they read the log after
it only: lists and history end at the cut (the API adds the marker), and a
changeset at or before it, or a time bound reaching back to it, is a 410.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.db.models import Count, QuerySet, TextField
from django.db.models.functions import Cast

from changesets import chain, partitions
from changesets.archive import boundary
from changesets.archive.models import ArchiveBase, ArchiveCut
from changesets.models import BASELINE, COMMON_RPCS, Changeset, LogHead, Revision
from changesets.selectors import by_namespace
from changesets.selectors.bounds import page_bounds
from changesets.selectors.rows import ENTITY_WHERE, HistoryRow, history_rows
from entities.store import EntityKey

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


def entity_history(
    *, key: EntityKey, branch: str = BASELINE, before_seq: int | None = None, limit: int = 50
) -> list[HistoryRow]:
    """One entity's revisions, newest first, off the ``revision_history`` index.

    Cost grows with the page, not with the size of the log; rows, not model
    instances (:mod:`changesets.selectors.rows` says why).
    """
    params: list[Any] = [branch, key.namespace, key.kind, key.slug]
    where, params = after_cut(ENTITY_WHERE, params)
    return history_rows(where, params, before_seq=before_seq, limit=limit)


def after_cut(where: str, params: list[Any]) -> tuple[str, list[Any]]:
    """``where`` over the revision table narrowed to the log after the archive cut
    (unchanged when nothing is archived, so the statement is the same)."""
    floor = boundary.floor()
    if not floor:
        return where, params
    return f"{where} AND changesets_revision.seq > %s", [*params, floor]


def entity_has_history(*, key: EntityKey, branch: str = BASELINE) -> bool:
    """Whether the key has revisions after the cut, or (baseline) a row in the state at it."""
    floor = boundary.floor()
    revisions = Revision.objects.filter(
        branch=branch, namespace=key.namespace, kind=key.kind, slug=key.slug
    )
    if not floor:
        return revisions.exists()
    hot = revisions.filter(seq__gt=floor).exists()
    if hot or branch != BASELINE:
        return hot
    return ArchiveBase.objects.filter(
        namespace=key.namespace, kind=key.kind, slug=key.slug, valid_from__lte=floor
    ).exists()


def visible_changesets(
    namespaces: Sequence[str] | None, *, seek_elsewhere: bool = False
) -> QuerySet[Changeset]:
    """Changesets with at least one op the caller can read (invariant 8).

    The test is :func:`~changesets.selectors.by_namespace.touching`, which the
    namespaces' position indexes serve; a page newest first merges them instead
    (:func:`changeset_list`).

    ``seek_elsewhere``: the caller also filters by something a small seq-ordered
    index serves (an rpc outside ``COMMON_RPCS``: ``changeset_rare_rpc``; a named
    branch: ``changeset_branch_seq``). The test is then written so that no
    namespace index can serve it, and the plan drives from that index, testing
    each row: by the namespaces' index (GIN then) the planner ANDed in a bitmap
    of every readable changeset, 40 ms at ten million for a reader of a 3%
    namespace, growing with the log (issue 18). The cost is then the filter's
    rows above the page, at most the rpc's or the branch's. (For a branch page
    the two plans cost nearly the same at 60,000 changesets, so the planner
    took either by the run: ``test_scale_plans``.)
    """
    qs = Changeset.objects.all()
    if namespaces is None:
        return qs
    if seek_elsewhere:
        qs = qs.alias(plain=Cast("namespaces", ArrayField(TextField())))
        return qs.filter(**{"plain__overlap": list(namespaces)})
    return qs.filter(by_namespace.touching(namespaces))


def sees_every_namespace(changeset: Changeset, namespaces: Sequence[str] | None) -> bool:
    """True when the caller may read every namespace ``changeset`` touched.

    Only such a caller is shown its ``op_count``, ``message`` and ``comment``
    (API.md "Limits and visibility"): they would tell how much it did where
    the caller cannot look.
    """
    return namespaces is None or set(changeset.namespaces) <= set(namespaces)


def previous_hash(changeset: Changeset) -> str | None:
    """The chain hash before ``changeset``, the one its ``hash`` covers.

    Stored on changesets written before migration 0034; since then it is the
    previous changeset's ``hash`` (seq is contiguous), or the archive cut's at
    that seq when the previous one is archived, or the genesis before seq 1.
    """
    if changeset.prev_hash:
        return changeset.prev_hash
    if changeset.seq == 1:
        return chain.GENESIS
    before = changeset.seq - 1
    found = Changeset.objects.filter(seq=before).values_list("hash", flat=True).first()
    return found or ArchiveCut.objects.filter(seq=before).values_list("hash", flat=True).first()


def revisions_of(changeset: Changeset) -> QuerySet[Revision]:
    """A changeset's revisions, found by its seq (then its id checked).

    The revision table is partitioned by ``seq``: with the seq in the predicate
    a read touches the one partition that holds the changeset (by
    ``revision_seq_entity``, ``seq`` first), where by ``changeset_id`` alone it
    would scan every partition (no index leads with it since migration 0031).
    A changeset has exactly one seq, which its revisions copy (``verify_log``
    checks the copy).
    """
    return Revision.objects.filter(seq=changeset.seq, changeset_id=changeset.id)


def _visible_revisions(
    changeset: Changeset, namespaces: Sequence[str] | None, *, sees_all: bool
) -> QuerySet[Revision]:
    qs = revisions_of(changeset)
    if not sees_all and namespaces is not None:
        qs = qs.filter(namespace__in=list(namespaces))
    return qs


def changeset_list(
    *,
    namespaces: Sequence[str] | None,
    branch: str | None = None,
    namespace: str | None = None,
    author: str | None = None,
    rpc: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before_seq: int | None = None,
    limit: int = 50,
) -> list[Changeset]:
    """Newest first by ``seq``; ``branch=None`` means every branch, ``""`` baseline.

    Changesets only: their ops come from :func:`first_ops` (a bounded number each).
    A namespace filter, or a scoped reader's visibility, is served by the
    namespaces' seq-ordered indexes, merged (:mod:`~changesets.selectors.by_namespace`),
    when nothing else narrows the page but seq bounds; with an author, an rpc or
    a named branch the namespaces are a filter, and the seq index, the
    author's, the rare rpc's or the branch's drives.
    """
    source = _page_source(namespaces, namespace=namespace, author=author, rpc=rpc, branch=branch)
    if source is None:
        return []
    qs, merge_over = source
    if branch is not None:
        # A named branch: a backward seek on ``changeset_branch_seq``, which holds
        # branch changesets only (migration 0028). Baseline: the seq index read
        # backwards, skipping the few branch rows (cheap while baseline is most of
        # the log; a log mostly on branches would want the index whole again).
        qs = qs.filter(branch=branch)
    if author is not None:
        qs = qs.filter(author_name=author)
    if rpc is not None:
        qs = qs.filter(rpc=rpc)
    bounds = page_bounds(since=since, until=until, before_seq=before_seq)
    if bounds is None:
        return []

    qs = qs.filter(**{f"seq__{lookup}": value for lookup, value in bounds.items()})

    def read(window: list[tuple[str, int]], n: int) -> list[Changeset]:
        if merge_over is not None:
            # Merged from the namespaces' own indexes: nothing but the branch and
            # seq bounds narrows such a page (``_page_source``).
            return by_namespace.newest_touching(
                merge_over, branch=branch, seq_bounds=list(bounds.items()), window=window, limit=n
            )
        within = qs.filter(**{f"seq__{lookup}": seq for lookup, seq in window})
        return list(within.order_by("-seq")[:n])

    tested_row_by_row = merge_over is None and namespaces is not None and namespace is None
    if (rpc is not None and rpc not in COMMON_RPCS) or tested_row_by_row:
        # A rare rpc's few rows, or a filter whose rows are tested against a
        # reader's namespaces one by one: a window would seldom fill, and cost a
        # second plan. (With a readable ``namespace`` the statement is the
        # superuser's, and is read like it: ``_page_source``.)
        return read([], limit)
    # The page's newest possible seq: the cursor's, an ``until``'s, else the head's.
    tops = [bounds["lt"] - 1] if "lt" in bounds else []
    tops += [bounds["lte"]] if "lte" in bounds else []
    top = min(tops) if tops else _head()
    return newest_in_window(read, top=top, limit=limit)


def _head() -> int | None:
    """The log head's seq; None without a head row (a log Atlas did not write)."""
    return LogHead.objects.filter(pk=1).values_list("seq", flat=True).first()


def newest_in_window(
    read: Callable[[list[tuple[str, int]], int], list[Changeset]],
    *,
    top: int | None,
    limit: int,
) -> list[Changeset]:
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


def _page_source(
    namespaces: Sequence[str] | None,
    *,
    namespace: str | None,
    author: str | None,
    rpc: str | None,
    branch: str | None,
) -> tuple[QuerySet[Changeset], list[str] | None] | None:
    """What a page of :func:`changeset_list` reads: the changesets to filter and,
    when the namespaces' own indexes serve it, the namespaces to merge arms over.
    None: the page is empty (a namespace the caller may not read)."""
    merge_over: list[str] | None = None
    # The namespaces' own indexes are merged only when nothing but seq bounds
    # narrows the page: an arm reads until it has a page that passes the other
    # filters, and what an arm holds can be all one kind (every changeset at
    # position 2 is a batch: a PutEntity page read the 3% namespace's 42,015 of
    # them at ten million, 125 ms). Otherwise the namespaces are a filter, and
    # the seq index, the author's, the rare rpc's or the branch's drives, as
    # before migration 0037.
    narrowed = author is not None or rpc is not None or bool(branch)
    if namespace is not None:
        if namespaces is not None and namespace not in namespaces:
            # Filtering by an unreadable namespace must not reveal which
            # changesets touched it (invariant 8).
            return None
        # A readable namespace is the whole visibility test: with the overlap
        # as well, the planner multiplied the two selectivities, expected 40
        # times too few rows and sorted the namespace's every changeset
        # (issue 18); alone, the plan is the superuser's.
        qs = Changeset.objects.all()
        if rpc is not None and rpc not in COMMON_RPCS:
            # Drive from ``changeset_rare_rpc`` (a rare rpc's rows are few) and
            # test the namespace on those: by the namespace's indexes, the
            # planner ANDed in a bitmap of the namespace's every changeset (8 ms
            # at a million for a 3% namespace, growing with the log).
            qs = qs.alias(plain=Cast("namespaces", ArrayField(TextField())))
            qs = qs.filter(**{"plain__contains": [namespace]})
        elif not narrowed:
            merge_over = [namespace]
        else:
            qs = qs.filter(by_namespace.touching([namespace]))
    else:
        rare_rpc = rpc is not None and rpc not in COMMON_RPCS
        seek_elsewhere = rare_rpc or bool(branch)
        if namespaces is not None and not narrowed and len(namespaces) <= by_namespace.MERGE_MOST:
            qs, merge_over = Changeset.objects.all(), list(namespaces)
        else:
            qs = visible_changesets(namespaces, seek_elsewhere=seek_elsewhere)
    return qs, merge_over


def changeset_get(*, changeset_id: str, namespaces: Sequence[str] | None) -> Changeset | None:
    """One changeset if the caller can read at least one of its ops; else None (404).

    Without its ops: they are paged (:func:`changeset_ops`). One at or before the
    archive cut, or an unknown id that may be archived, is a 410.
    """
    changeset = visible_changesets(namespaces).filter(pk=changeset_id).first()
    if changeset is None:
        boundary.check_unknown_changeset(changeset_id)
        return None
    boundary.check_seq(changeset.seq, "That changeset is archived.")
    return changeset


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


def log_head() -> LogHead | None:
    """The log head row (None before the first write): ``GET /log/head`` shows it."""
    return LogHead.objects.filter(pk=1).first()
