"""Where the next cut goes: what was asked, and what may be archived now.

``--before N`` archives the changesets with seq < N; ``--before <time>`` those
with ``at`` before the time. The cut is then pulled back (never pushed on)
so that nothing still needed hot is archived:

1. an open branch's history since its fork stays hot (its diff, merge and
   sync read baseline as of its base point, and its own changesets); the cut
   stays below the oldest open branch's fork;
2. an active subscription's cursor stays hot: the cut is strictly below it
   (a cursor at or before the cut answers 410, API.md "Archive and
   retention", so a live subscription is never cut at its own cursor);
3. journal entries not yet published stay (their post-commit work reads
   the changeset): the cut stays below the oldest (a published entry is
   deleted, so every entry left is one of these);
4. never past the log head, never before the previous cut;
5. a cut drops whole revision partitions (``changesets.archive.hot``), so it
   ends where a partition ends: the last seq of the highest partition wholly
   at or below the cut (one segment per partition).

Each limit that moved the cut is reported, so an operator sees why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection
from django.db.models import Max, Min

from atlas import conf
from changesets import partitions
from changesets.archive import reader
from changesets.archive.models import ArchiveCut
from changesets.models import JournalEntry, JournalPhase, LogHead, Subscription


@dataclass(frozen=True)
class SegmentRange:
    first_seq: int
    last_seq: int
    changesets: int
    revisions: int


@dataclass
class Plan:
    """A cut: ``seq`` 0 (or not past ``previous``) means nothing to archive now."""

    requested: int
    seq: int
    previous: int
    limits: list[str] = field(default_factory=list)
    segments: list[SegmentRange] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.seq <= self.previous

    @property
    def changesets(self) -> int:
        return sum(s.changesets for s in self.segments)

    @property
    def revisions(self) -> int:
        return sum(s.revisions for s in self.segments)


def requested_seq(before: int | datetime) -> int:
    """The last seq the request archives (0: none)."""
    if isinstance(before, int):
        return max(before - 1, 0)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq FROM changesets_changeset WHERE at < %s ORDER BY at DESC, seq DESC LIMIT 1",
            [before],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _branch_limit() -> int | None:
    """The cut that keeps every open branch's history since its fork hot (step 1).

    Read from the table (``changesets`` never imports ``branches``)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT min(fork_seq) FROM branches_branch WHERE status = 'open'")
        row = cursor.fetchone()
    return None if row is None or row[0] is None else int(row[0]) - 1


def limits() -> list[tuple[int, str]]:
    """(highest seq allowed, why) for every limit of steps 1-4 that applies now."""
    found: list[tuple[int, str]] = []
    head = LogHead.objects.filter(pk=1).values_list("seq", flat=True).first() or 0
    found.append((head, f"the log head is at seq {head}"))
    branch = _branch_limit()
    if branch is not None:
        found.append((branch, f"an open branch forked at seq {branch + 1}"))
    cursor = Subscription.objects.filter(active=True).aggregate(m=Min("cursor_seq"))["m"]
    if cursor is not None:
        found.append((cursor - 1, f"an active subscription's cursor is at seq {cursor} (kept hot)"))
    pending = JournalEntry.objects.filter(phase=JournalPhase.COMMITTED).aggregate(m=Min("seq"))
    if pending["m"] is not None:
        found.append(
            (pending["m"] - 1, f"the journal entry of seq {pending['m']} is not published yet")
        )
    return found


def previous_cut() -> int:
    return ArchiveCut.objects.aggregate(m=Max("seq"))["m"] or 0


def partition_limit(seq: int) -> tuple[int, str] | None:
    """Step 5: the end of the highest partition wholly at or below ``seq`` (None: the
    table is not partitioned, or ``seq`` ends a partition already)."""
    parts = partitions.partitions()
    if not parts:
        return None
    ends = [p for p in parts if p.last_seq <= seq]
    if ends and ends[-1].last_seq == seq:
        return None
    if not ends:
        return 0, f"the cut ends where a partition ends; the first ends at seq {parts[0].last_seq}"
    last = ends[-1]
    return last.last_seq, f"the cut ends where partition {last.name} ends (seq {last.last_seq})"


def plan_cut(before: int | datetime) -> Plan:
    """Steps 1-5 of the module docstring, and the segment ranges of the cut."""
    requested = requested_seq(before)
    previous = previous_cut()
    plan = Plan(requested=requested, seq=requested, previous=previous)
    for limit, why in limits():
        if limit < plan.seq:
            plan.seq = limit
            plan.limits.append(why)
    aligned = partition_limit(plan.seq) if plan.seq > previous else None
    if aligned is not None:
        plan.seq = aligned[0]
        plan.limits.append(aligned[1])
    if not plan.empty:
        plan.segments = segment_ranges(previous, plan.seq)
    return plan


def segment_ranges(previous: int, cut: int) -> list[SegmentRange]:
    """Whole changesets ``previous+1..cut``: one segment per revision partition.

    On a table that is not partitioned, segments of about
    ``ATLAS_ARCHIVE_SEGMENT_REVISIONS`` revisions (a bigger changeset has one alone).
    """
    parts = partitions.partitions()
    budget = int(conf.get("ATLAS_ARCHIVE_SEGMENT_REVISIONS"))
    out: list[SegmentRange] = []
    first, last, changesets, revisions, upper = None, None, 0, 0, 0
    for seq, op_count, _ in reader.op_counts(previous, cut):
        full = seq >= upper if parts else revisions + op_count > budget
        if first is not None and full:
            out.append(SegmentRange(first, last or first, changesets, revisions))
            first, changesets, revisions = None, 0, 0
        if first is None:
            first = seq
            upper = next((p.upper for p in parts if p.lower <= seq < p.upper), seq + 1)
        last, changesets, revisions = seq, changesets + 1, revisions + op_count
    if first is not None:
        out.append(SegmentRange(first, last or first, changesets, revisions))
    return out
