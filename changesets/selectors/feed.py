"""The change feed: records derived from baseline revision rows (DESIGN "The change feed").

There is no second log. A page is "the revision rows with ``seq`` greater than
the cursor, in ``(seq, id)`` order", cut after the last changeset that
started within ``limit`` rows. Why "seq greater than the cursor" can never
skip a committed changeset: ``seq`` is drawn under the log head's row lock as
the last step before commit (invariant 6), so once a reader can see seq N,
every changeset with a smaller seq has already committed and is visible too.

Cursors are the seq of the last changeset a page contained, signed
(``django.core.signing``) so they are opaque and tamper-evident. They do not
expire and do not depend on the filter or capture mode: a cursor is a position
in the one log. After an archive cut at C (``changesets.archive.boundary``) a
cursor before C is owed records only the archive holds: 410, never a page that
skips them. A cursor at C has seen everything through C and reads on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.core import signing
from django.db import connection
from django.db.models import BigIntegerField, QuerySet
from django.db.models.expressions import RawSQL

from atlas.api.render import rfc3339
from atlas.exceptions import BadRequest
from changesets import partitions
from changesets.archive import boundary as cuts
from changesets.models import BASELINE, Capture, Changeset, Revision
from changesets.selectors.bounds import log_head_seq, newest_in_window, within
from changesets.selectors.feed_values import stored_changed_values
from changesets.selectors.rows import AT_MICROS, from_micros

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_CURSOR_SALT = "atlas.feed.cursor"
# A Signer without a timestamp: the same position always encodes to the same
# string, so "an empty page returns since unchanged" holds byte for byte.
_signer = signing.Signer(salt=_CURSOR_SALT)

_RECORD_FIELDS = (
    "id",
    "seq",
    "changeset_id",
    "namespace",
    "kind",
    "slug",
    "op",
    "undo",
    "undo_gone",
    "after",
    "after_version",
    "changed",
    "at_micros",
)
# A record's columns from its changeset, read by the page's seqs (:func:`_changesets`).
_CHANGESET_FIELDS = ("seq", "author_name", "rpc", "metadata", "context")


def cursor_encode(seq: int) -> str:
    """The opaque cursor for "everything after seq"."""
    return _signer.sign_object({"s": int(seq)})


def cursor_decode(cursor: str, *, pointer: str = "/since") -> int:
    """The seq a cursor stands for; a forged or edited cursor is a 400."""
    try:
        value = _signer.unsign_object(cursor)
    except (signing.BadSignature, ValueError, TypeError) as exc:
        raise BadRequest("The cursor is invalid.", pointer=pointer) from exc
    seq = value.get("s") if isinstance(value, dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise BadRequest("The cursor is invalid.", pointer=pointer)
    return seq


def _changesets(rows: list[dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    """The page's changesets' columns a record shows, by seq: one statement after the
    page, by its seqs as a literal list, so it is pruned to their partitions when
    planned. Joined to the revisions instead, the page's statement planned a scan
    of every changeset partition for each revision partition it might read
    (``changesets.selectors.rows`` says more)."""
    seqs = sorted({row["seq"] for row in rows})
    if not seqs:
        return {}
    found = Changeset.objects.filter(seq__in=seqs).values_list(*_CHANGESET_FIELDS)
    return {seq: rest for seq, *rest in found}


def _record(row: dict[str, Any], changeset: tuple[Any, ...], capture: str) -> dict[str, Any]:
    author, rpc, metadata, context = changeset
    changeset_id = str(row["changeset_id"])
    ns, kind, slug = row["namespace"], row["kind"], row["slug"]
    record: dict[str, Any] = {
        "event_id": f"{changeset_id}:{ns}/{kind}/{slug}",
        "changeset_id": changeset_id,
        "seq": row["seq"],
        "at": rfc3339(from_micros(row["at_micros"])),
        "author": author,
        "rpc": rpc,
        "op": row["op"],
        "namespace": ns,
        "kind": kind,
        "slug": slug,
        "version": row["after_version"],
        "changed": row["changed"],
        "metadata": metadata or {},
        "context": context,
    }
    if capture == Capture.NEW_ROW:
        record["new_row"] = row["after"]
    else:
        old, new = stored_changed_values(row["op"], row["after"], row["undo"], row["undo_gone"])
        if capture == Capture.OLD_AND_NEW_VALUES:
            record["old_values"] = old
        record["new_values"] = new
    return record


def watermark() -> dict[str, Any]:
    """The newest committed baseline changeset, whatever any filter says.

    Sought first among the newest partition's width of seqs at or below the log
    head, then below (:func:`~changesets.selectors.bounds.newest_in_window`): with
    literal bounds the statement is planned over the one
    or two partitions they span, where newest-first over the whole table it was
    planned over every partition (1 ms at ten million changesets, for a row the
    newest partition holds unless the log's last million changesets were all on
    branches).
    """
    baseline = Changeset.objects.filter(branch=BASELINE).order_by("-seq")
    newest = baseline.values_list("id", "seq", "at")

    def read(window: list[tuple[str, int]], n: int) -> list[tuple[Any, ...]]:
        return list(within(newest, window)[:n])

    found = newest_in_window(read, top=log_head_seq(), limit=1)
    row = found[0] if found else None
    if row is None:
        return {"seq": 0, "changeset_id": None, "at": None}
    return {"seq": row[1], "changeset_id": str(row[0]), "at": rfc3339(row[2])}


@dataclass
class FeedPage:
    """One page of the feed, ready to render."""

    records: list[dict[str, Any]]
    after_seq: int
    last_seq: int
    capture: str
    watermark: dict[str, Any]
    # The page stopped at ``limit``: more records may follow right now.
    full: bool = False
    changesets: int = field(default=0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "next_cursor": cursor_encode(self.last_seq),
            "watermark": self.watermark,
            "capture": self.capture,
        }


def _revisions(after_seq: int, namespaces: Sequence[str] | None) -> QuerySet[Revision]:
    # The changeset's time is the revision's copy, read as epoch microseconds
    # (``changesets.selectors.rows.from_micros`` says why).
    at_micros = RawSQL(AT_MICROS, [], output_field=BigIntegerField())
    qs = Revision.objects.filter(branch=BASELINE, seq__gt=after_seq).annotate(at_micros=at_micros)
    if namespaces is not None:
        qs = qs.filter(namespace__in=list(namespaces))
    return qs


def _check_cursor(after_seq: int, *, from_cut: bool) -> None:
    """410 for a cursor at or before the archive cut (API.md "Archive and retention"):
    what it is owed may be in the archive.

    ``from_cut`` is for readers that start at the cut by construction, not from a
    cursor a client held: a pull without ``since`` ("from the beginning" begins at
    the cut) and a subscription made or moved there (its cursor is the cut).
    """
    cut = cuts.current()
    if cut is None or after_seq > cut.seq or (from_cut and after_seq == cut.seq):
        return
    raise cuts.gone(
        f"The cursor (after seq {after_seq}) is at or before the archive cut.",
        cut=cut,
        seq=after_seq + 1,
        pointer="/since",
    )


def _page_rows(
    after_seq: int, namespaces: Sequence[str] | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """Steps 1 and 2 of :func:`feed_page`: its revision rows, and whether the page is
    full (it stopped at ``limit``)."""
    qs = _revisions(after_seq, namespaces).order_by("seq", "id").values(*_RECORD_FIELDS)
    # First within a partition's width above the cursor, with a literal bound, so
    # the statement is planned over the one or two partitions it spans (from the
    # start of a ten-million log it was planned over all 13: 3.7 ms to plan, 0.5
    # to run); above that only if the window came up short.
    edge = after_seq + partitions.width()
    rows = list(qs.filter(seq__lte=edge)[: limit + 1])
    if len(rows) <= limit:
        rows += list(qs.filter(seq__gt=edge)[: limit + 1 - len(rows)])
    if len(rows) <= limit:
        return rows, False
    boundary, spill = rows[limit - 1], rows[limit]
    rows = rows[:limit]
    if spill["seq"] == boundary["seq"]:
        rest = (
            _revisions(after_seq, namespaces)
            .filter(seq=boundary["seq"], id__gt=boundary["id"])
            .order_by("id")
            .values(*_RECORD_FIELDS)
        )
        rows.extend(rest)
    return rows, True


def feed_page(
    *,
    after_seq: int,
    namespaces: Sequence[str] | None,
    capture: str = Capture.NEW_VALUES,
    limit: int = DEFAULT_LIMIT,
    from_cut: bool = False,
) -> FeedPage:
    """The baseline records after ``after_seq`` in namespaces ``namespaces`` (None = all).

    1. Read up to ``limit + 1`` revision rows in ``(seq, id)`` order off the
       ``revision_seq_entity`` index (seq first): within a partition's width of
       seqs above the cursor first, then above that if they came up short.
    2. If row ``limit + 1`` belongs to the same changeset as row ``limit``,
       read the rest of that changeset too: pages end on changeset
       boundaries, so a page may exceed ``limit``.
    3. Read the page's changesets by their seqs (:func:`_changesets`).
    4. Read the watermark last, so it is never behind the page's records.

    ``after_seq`` before the archive cut is a 410 (module docstring).

    ``namespaces`` must already be limited to what the reader may see
    (invariant 8); an empty list yields no records. Callers time it
    (``changesets.outbox.metrics.feed_page_timer``): they know which surface
    they serve, and the feed stays free of the metrics that read it.
    """
    _check_cursor(after_seq, from_cut=from_cut)
    rows: list[dict[str, Any]] = []
    full = False
    if namespaces is None or len(namespaces) > 0:
        rows, full = _page_rows(after_seq, namespaces, limit)
    changesets = _changesets(rows)
    mark = watermark()
    # (A row whose changeset went after it was read, archived, is left out, as the
    # join of the two tables left it out: ``rows.with_briefs``.)
    rows = [row for row in rows if row["seq"] in changesets]
    records = [_record(row, changesets[row["seq"]], capture) for row in rows]
    last_seq = rows[-1]["seq"] if rows else after_seq
    return FeedPage(
        records=records,
        after_seq=after_seq,
        last_seq=last_seq,
        capture=str(capture),
        watermark=mark,
        full=full,
        changesets=len({row["seq"] for row in rows}),
    )


# How many baseline changesets have a seq above ``%s`` (twice the same bound), from two
# indexes alone: every changeset above it (an index-only range of the seq index) less each
# branch's (the branch names by a loose scan of ``changeset_branch_seq``, then an
# index-only range of it per branch). That index holds branch changesets only (migration
# 0028), so ``branch = ''`` would read every row above the bound from the table: 1.7
# times the index-only count at 400,000 changesets, where this is as fast or faster.
BASELINE_AFTER_COUNT = """(
    (SELECT count(*) FROM changesets_changeset WHERE seq > %s)
    - (WITH RECURSIVE b(name) AS (
           (SELECT branch FROM changesets_changeset WHERE branch <> ''
            ORDER BY branch LIMIT 1)
           UNION ALL
           SELECT (SELECT c.branch FROM changesets_changeset c
                   WHERE c.branch > b.name AND c.branch <> '' ORDER BY c.branch LIMIT 1)
           FROM b WHERE b.name IS NOT NULL)
       SELECT count(*) FROM b JOIN changesets_changeset c ON c.branch = b.name
       WHERE c.branch <> '' AND c.seq > %s)
)"""


def changesets_after(*, after_seq: int, namespaces: Sequence[str] | None) -> int:
    """How many baseline changesets after ``after_seq`` touch ``namespaces`` (None = any).

    This is a subscription's ``lag``: the changesets it still has to deliver.
    Every namespace: :data:`BASELINE_AFTER_COUNT`, index-only. Some: the rows
    after ``after_seq`` are read for their namespaces anyway.
    """
    if namespaces is None:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {BASELINE_AFTER_COUNT}", [after_seq, after_seq])
            return int(cursor.fetchone()[0])
    qs = Changeset.objects.filter(branch=BASELINE, seq__gt=after_seq)
    return qs.filter(namespaces__overlap=list(namespaces)).count()


def has_records_after(*, after_seq: int, namespaces: Sequence[str] | None) -> bool:
    """Whether a reader at ``after_seq`` has anything left to read."""
    qs = Changeset.objects.filter(branch=BASELINE, seq__gt=after_seq)
    if namespaces is not None:
        qs = qs.filter(namespaces__overlap=list(namespaces))
    return qs.exists()


def effective_namespaces(
    readable: Sequence[str] | None, requested: Sequence[str] | None
) -> list[str] | None:
    """What a reader sees: the requested namespaces it may read (None = all)."""
    if requested is None:
        return None if readable is None else list(readable)
    if readable is None:
        return list(requested)
    allowed = set(readable)
    return [ns for ns in requested if ns in allowed]


def visible_watermark(mark: dict[str, Any], readable: Sequence[str] | None) -> dict[str, Any]:
    """``mark`` (:func:`watermark`) as a reader of ``readable`` (None = all) may see it.

    ``seq`` and ``at`` stay global (the log's position, public at /log/head);
    the id of a changeset the reader cannot see is not shown (not visible =
    not there), whatever the page's namespace filter.
    """
    if not mark["changeset_id"] or readable is None:
        return mark
    # By its seq as well: the id alone names no partition (``changeset_ids``).
    seen = Changeset.objects.filter(
        pk=mark["changeset_id"], seq=mark["seq"], namespaces__overlap=list(readable)
    )
    if readable and seen.exists():
        return mark
    return {**mark, "changeset_id": None}
