"""What reads need of the archive: the current cut, its marker, its 410s, its SQL source.

After a cut at seq C (``ArchiveCut`` in state ``switched`` or ``removed``),
reads see the log after C only (API.md "Archive and retention"):

- lists and history end at C with ``"archived_before": {"seq": C, "checkpoint":
  <hash>}`` (:func:`marker`);
- anything naming a point at or before C (a cursor, ``as_of``, ``since``, a
  changeset id) is a 410 naming the checkpoint and the archive (:func:`gone`);
- as-of reads after C read the hot revisions after C beside the state at C
  (``ArchiveBase``), through :func:`revision_source`, so they answer exactly
  what they answered before the cut.

Why a cache, and why it is safe: every read asks for the cut, so it is kept
per process for ``ATLAS_ARCHIVE_CUT_CACHE_SECONDS``. A reader with a stale
answer reads as before the newest cut; that is still right, because the
archiver waits ``ATLAS_ARCHIVE_GRACE_SECONDS`` (at least twice the cache's
life) between moving reads to a cut and removing a row (``archiver``), and the
state at the older cut stays valid beside the newer one (``ArchiveBase``).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from atlas import conf
from atlas.process_cache import Expiring
from changesets.archive.models import ACTIVE_STATES, ArchiveCut
from changesets.exceptions import Archived


@dataclass(frozen=True)
class Cut:
    """The newest cut reads end at."""

    seq: int
    hash: str
    at: datetime
    max_changeset_id: uuid.UUID
    location: str


def _load() -> Cut | None:
    row = (
        ArchiveCut.objects.filter(state__in=ACTIVE_STATES)
        .order_by("-seq")
        .values_list("seq", "hash", "at", "max_changeset_id", "location")
        .first()
    )
    return Cut(*row) if row else None


_cut: Expiring[Cut | None] = Expiring(
    _load, lambda: float(conf.get("ATLAS_ARCHIVE_CUT_CACHE_SECONDS"))
)


def current() -> Cut | None:
    """The cut reads end at (None: nothing archived), cached for a short while."""
    return _cut.get()


def forget() -> None:
    """Drop the cached cut (the archiver calls it when it moves reads in this process)."""
    _cut.forget()


def prime(cut: Cut | None, *, seconds: float = float("inf")) -> None:
    """Set the cached answer (tests start every test on a log with no cut)."""
    _cut.prime(cut, seconds=seconds)


def floor() -> int:
    """The seq reads start after: the cut's, or 0."""
    cut = current()
    return cut.seq if cut is not None else 0


def marker(cut: Cut | None = None) -> dict[str, Any] | None:
    """``{"seq", "checkpoint"}`` of the cut a listing ends at (None: no cut)."""
    cut = cut or current()
    return {"seq": cut.seq, "checkpoint": cut.hash} if cut is not None else None


def _covering_hash(seq: int | None, cut: Cut) -> str:
    """The checkpoint (its chain hash) of the cut that archived ``seq``; the newest if unknown."""
    if seq is None:
        return cut.hash
    found = (
        ArchiveCut.objects.filter(state__in=ACTIVE_STATES, seq__gte=seq, from_seq__lte=seq)
        .values_list("hash", flat=True)
        .first()
    )
    return found or cut.hash


def gone(detail: str, *, cut: Cut, seq: int | None = None, pointer: str | None = None) -> Archived:
    """The 410 for something at or before ``cut`` (``seq``: its position, when known)."""
    return Archived(
        f"{detail} The log through seq {cut.seq} is in the archive (GET /api/v1/log/checkpoints).",
        seq=cut.seq,
        checkpoint=_covering_hash(seq, cut),
        archive=cut.location,
        pointer=pointer,
    )


def check_seq(seq: int, what: str, *, pointer: str | None = None) -> None:
    """410 when ``seq`` is at or before the cut."""
    cut = current()
    if cut is not None and seq <= cut.seq:
        raise gone(what, cut=cut, seq=seq, pointer=pointer)


def check_since(at: datetime, what: str, *, pointer: str | None = None) -> None:
    """410 for a lower time bound at or before the cut's time: "at or after ``at``"
    would take in archived changesets (the cut's own ``at`` included)."""
    cut = current()
    if cut is not None and at <= cut.at:
        raise gone(what, cut=cut, pointer=pointer)


def check_unknown_changeset(changeset_id: Any, *, pointer: str | None = None) -> None:
    """410 for a changeset id not in the hot log that may be archived.

    Ids are UUIDv7 (creation order): any id at or below the largest archived
    one may be there. The archive cannot say which namespaces an archived
    changeset touched, so every such id answers the same (existing, hidden or
    never made alike), and a caller learns nothing it could not guess.
    """
    cut = current()
    try:
        value = changeset_id if isinstance(changeset_id, uuid.UUID) else uuid.UUID(changeset_id)
    except (TypeError, ValueError):
        return
    if cut is not None and value <= cut.max_changeset_id:
        raise gone("That changeset may be archived.", cut=cut, pointer=pointer)


# The revision columns as-of statements read, in both arms of the source (no
# before image: they read ``after``; the two tables store before differently).
COLUMNS = (
    "changeset_id, seq, branch, at, namespace, kind, slug, op, after,"
    " before_version, after_version, changed"
)
# The state's ``changed`` is still a ``text[]``; the revision's is one text joined by
# "~2" since migration 0035, and the arms must agree.
_BASE_COLUMNS = COLUMNS.replace(" changed", " array_to_string(changed, '~2')")
_LIVE = re.compile(r"\{live:(\w+)\}")


def revision_source(cut: Cut | None = None, *, table: str = "changesets_revision") -> str:
    """SQL for ``FROM``: the revisions an as-of read sees (with :func:`live` on each alias).

    Without a cut, the revision table itself (the statement is unchanged). With
    one, the revision table and the state at the cut as one relation with the
    revision's columns plus ``arm`` (1: a revision, 2: a state row) and the
    state rows' validity. The arms carry no WHERE of their own: PostgreSQL then
    flattens them into one append relation, pushes each statement's conditions
    into both (``live`` folds to one condition per arm) and merges their index
    order (Merge Append); an arm with a WHERE stays a subquery, planned alone,
    and its sorted index order is lost (a sort of every create of a namespace).
    """
    cut = cut or current()
    if cut is None:
        return table
    return (
        f"(SELECT id, {COLUMNS}, 1 AS arm, NULL::bigint AS valid_from,"
        f" NULL::bigint AS valid_to FROM {table}"
        f" UNION ALL SELECT revision_id, {_BASE_COLUMNS}, 2, valid_from, valid_to"
        " FROM changesets_archivebase)"
    )


def live(alias: str, cut: Cut | None) -> str:
    """The condition (`` AND …``) that keeps, of :func:`revision_source`'s rows under
    ``alias``, the revisions after the cut and the state rows valid at it."""
    if cut is None:
        return ""
    c, a = int(cut.seq), alias
    return (
        f" AND (({a}.arm = 1 AND {a}.seq > {c}) OR ({a}.arm = 2 AND {a}.valid_from <= {c}"
        f" AND ({a}.valid_to IS NULL OR {a}.valid_to > {c})))"
    )


def sourced(sql: str, cut: Cut | None = None) -> str:
    """``sql`` with ``{source}`` as :func:`revision_source` and each ``{live:alias}``
    as :func:`live` (both empty of change without a cut)."""
    cut = cut or current()
    sql = sql.replace("{source}", revision_source(cut))
    return _LIVE.sub(lambda match: live(match[1], cut), sql)
