"""Reads of the changeset log: history, lists, single changesets.

Every function takes the caller's readable namespaces (``None`` = all) and
filters by them, so visibility is decided in one place per query.

After an archive cut (``changesets.archive.boundary``) they read the log after
it only: lists and history end at the cut (the API adds the marker), and a
changeset at or before it, or a time bound reaching back to it, is a 410.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast

from changesets import chain, keyhash
from changesets.archive import boundary
from changesets.archive.models import ArchiveBase, ArchiveCut
from changesets.models import BASELINE, COMMON_RPCS, Changeset, LogHead, Revision
from changesets.selectors import by_namespace, changeset_ids
from changesets.selectors.bounds import (
    newest_in_window,
    page_bounds,
    page_top,
    within,
)
from changesets.selectors.rows import REVISION, HistoryRow, history_rows
from entities.store import EntityKey


def entity_history(
    *, key: EntityKey, branch: str = BASELINE, before_seq: int | None = None, limit: int = 50
) -> list[HistoryRow]:
    """One entity's revisions, newest first, off the ``revision_key`` index.

    Cost grows with the page, not with the size of the log; rows, not model
    instances (:mod:`changesets.selectors.rows` says why).
    """
    where, params = entity_where(key, branch)
    return history_rows(where, params, before_seq=before_seq, limit=limit)


def entity_where(key: EntityKey, branch: str) -> tuple[str, list[Any]]:
    """SQL over the revision table for ``key``'s revisions on ``branch`` after the
    archive cut (a seek on ``revision_key``), and its parameters."""
    return after_cut(*keyhash.seek(REVISION, branch, key.namespace, key.kind, key.slug))


def entity_columns_where(key: EntityKey, branch: str) -> tuple[str, list[Any]]:
    """:func:`entity_where` by the key's columns, for the partial indexes keyed by them
    (``revision_creates``, ``revision_deletes``): an entity's creates or deletes."""
    return after_cut(
        f"{REVISION}.branch = %s AND {REVISION}.namespace = %s"
        f" AND {REVISION}.kind = %s AND {REVISION}.slug = %s",
        [branch, key.namespace, key.kind, key.slug],
    )


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
    revisions = Revision.objects.of_entity(branch, key.namespace, key.kind, key.slug)
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
    # A rare rpc's few rows, or a filter whose rows are tested against a reader's
    # namespaces one by one: a window would seldom fill, and cost a second plan.
    # (With a readable ``namespace`` the statement is the superuser's, and is read
    # like it: ``_page_source``.)
    tested_row_by_row = merge_over is None and namespaces is not None and namespace is None
    windowed = not tested_row_by_row and (rpc is None or rpc in COMMON_RPCS)
    return _read_page(qs, merge_over, branch, bounds, windowed=windowed, limit=limit)


def _read_page(
    qs: QuerySet[Changeset],
    merge_over: list[str] | None,
    branch: str | None,
    bounds: dict[str, int],
    *,
    windowed: bool,
    limit: int,
) -> list[Changeset]:
    """:func:`changeset_list`'s page: off ``qs``'s index, or merged from the
    namespaces' own (``merge_over``), within a window below its newest possible
    seq first if ``windowed`` (:func:`~changesets.selectors.bounds.newest_in_window`)."""

    def read(window: list[tuple[str, int]], n: int) -> list[Changeset]:
        if merge_over is not None:
            # Merged from the namespaces' own indexes: nothing but the branch and
            # seq bounds narrows such a page (``_page_source``).
            return by_namespace.newest_touching(
                merge_over, branch=branch, seq_bounds=list(bounds.items()), window=window, limit=n
            )
        return list(within(qs, window).order_by("-seq")[:n])

    if not windowed:
        return read([], limit)
    return newest_in_window(read, top=page_top(bounds), limit=limit)


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
    changeset = changeset_ids.find(visible_changesets(namespaces), changeset_id)
    if changeset is None:
        boundary.check_unknown_changeset(changeset_id)
        return None
    boundary.check_seq(changeset.seq, "That changeset is archived.")
    return changeset


def log_head() -> LogHead | None:
    """The log head row (None before the first write): ``GET /log/head`` shows it."""
    return LogHead.objects.filter(pk=1).first()
