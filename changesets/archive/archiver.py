"""The archive cut: a durable state machine, resumable after a crash at any step.

``archive_log`` and the retention task both call :func:`archive`. The cut's
``ArchiveCut`` row is the record; each step's work is repeatable, and the row
moves to the next state only once that work is durable:

1. **planned** — the cut (``changesets.archive.plan``) and its segment ranges
   are recorded in one transaction.
2. **written** — each segment is written to the archive storage
   (``files.write``); a segment's row records its digest only after its file
   is stored, so a crash mid-segment writes that segment again.
3. **verified** — every segment is read back from the storage and the chain
   recomputed across all of them, from the previous cut's hash to this cut's;
   the state at the cut is built (``base.build``) and must equal the state the
   segments give (``state.Replay``). A file that does not match is written
   again on the next run; a chain that does not recompute stops the cut.
4. **signed** — erasures since the segments were written are taken in
   (``rewrite.before_signing``), then the checkpoint is signed and stored,
   under the signing lock.
5. **switched** — reads end at the cut (``boundary``). Nothing is removed yet.
6. **removed** — after ``ATLAS_ARCHIVE_GRACE_SECONDS`` (readers that cached the
   previous cut have moved on), ``hot.remove_through`` detaches and drops the
   revision partitions the cut covers, one at a time, then removes the
   changesets and journal entries in short batches, recording its progress;
   then the retired state rows go.

The log's delete guard (migration 0024) admits a removal only for a signed,
switched cut, and ``hot`` drops a partition only for a signed, switched cut
whose segments are all verified, so no row goes whose segment was not
written and verified.
One archiver runs at a time (``locks.archiver``). ``pause`` is called at each
step's end (and after each segment, partition detach and drop, and batch) with the point's name: the
command's ``--pause-at`` hook stops there, which the crash tests use to kill
a real process at each step.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from atlas import conf
from changesets import chain, partitions
from changesets.archive import (
    base,
    boundary,
    checkpoint,
    files,
    hot,
    locks,
    plan,
    rewrite,
    segments,
    state,
    storage,
)
from changesets.archive.models import (
    ArchiveCut,
    ArchiveSegment,
    CutState,
    SegmentState,
)
from changesets.models import Erasure

# A progress bar factory: ``progress(total, unit, desc)`` → an object with ``update(n)``.
Progress = Callable[[int, str, str], Any]
Pause = Callable[[str], None]


class ArchiveFailed(Exception):
    """A cut cannot go on (the reason says what to do)."""


@dataclass
class Outcome:
    plan: plan.Plan | None = None
    cuts: list[ArchiveCut] = field(default_factory=list)
    rewrites: int = 0
    dry_run: bool = False


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _no_bar(total: int, unit: str, desc: str) -> Any:
    return _NoBar()


def archive(
    *,
    before: int | datetime | None,
    requested_by: str,
    dry_run: bool = False,
    progress: Progress | None = None,
    pause: Pause | None = None,
) -> Outcome:
    """Finish what a crash left (rewrites, an open cut), then cut ``before`` if it is new."""
    bars, stop = progress or _no_bar, pause or (lambda point: None)
    if dry_run:
        return Outcome(plan=plan.plan_cut(before) if before is not None else None, dry_run=True)
    storage.signing_key()  # refuse before anything is written, not at the signature
    with locks.archiver():
        partitions.ensure_ahead()  # one of upkeep's four callers (changesets.partitions)
        outcome = Outcome(rewrites=rewrite.run_pending())
        open_cut = ArchiveCut.objects.exclude(state=CutState.REMOVED).first()
        if open_cut is not None:
            outcome.cuts.append(_run(open_cut, bars, stop))
        if before is not None:
            outcome.plan = plan.plan_cut(before)
            if not outcome.plan.empty:
                cut = _record(outcome.plan, requested_by)
                stop("planned")
                outcome.cuts.append(_run(cut, bars, stop))
        return outcome


def _chain_at(seq: int) -> chain.Start:
    """The chain's state right after ``seq`` (as a start for ``seq + 1``)."""
    if seq == 0:
        return chain.Start()
    row = ArchiveCut.objects.filter(seq=seq).values_list("hash", "v1_hash").first() or _hot_chain(
        seq
    )
    return chain.Start(seq=seq + 1, hash=row[0], v1_hash=row[1] or None)


def _hot_chain(seq: int) -> tuple[str, str | None]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT encode(hash, 'hex'), encode(v1_hash, 'hex') FROM changesets_changeset"
            " WHERE seq = %s",
            [seq],
        )
        row = cursor.fetchone()
    if row is None:
        raise ArchiveFailed(f"seq {seq} is neither in the log nor a cut")
    return row[0], row[1]


@transaction.atomic
def _record(cut_plan: plan.Plan, requested_by: str) -> ArchiveCut:
    """Step 1: the cut and its segments, in one transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT encode(hash, 'hex'), encode(v1_hash, 'hex'), at,"
            " (SELECT max(id::text) FROM changesets_changeset"
            " WHERE seq > %s AND seq <= %s) FROM changesets_changeset WHERE seq = %s",
            [cut_plan.previous, cut_plan.seq, cut_plan.seq],
        )
        hash_, v1, at, max_id = cursor.fetchone()
    earlier = ArchiveCut.objects.order_by("-seq").values_list("max_changeset_id", flat=True)
    max_id = max([uuid.UUID(max_id), *earlier[:1]])  # the largest id archived so far
    start = _chain_at(cut_plan.previous)
    cut = ArchiveCut.objects.create(
        seq=cut_plan.seq,
        from_seq=cut_plan.previous + 1,
        prev_hash=start.hash,
        hash=hash_,
        v1_hash=v1 or "",
        at=at,
        max_changeset_id=max_id,
        changesets=cut_plan.changesets,
        revisions=cut_plan.revisions,
        location=storage.describe(),
        requested_by=requested_by,
        created_at=timezone.now(),
        erasure_watermark=Erasure.objects.order_by("-id").values_list("id", flat=True).first(),
    )
    ArchiveSegment.objects.bulk_create(
        ArchiveSegment(
            cut=cut,
            name=segments.segment_name(r.first_seq, r.last_seq),
            first_seq=r.first_seq,
            last_seq=r.last_seq,
            changesets=r.changesets,
            revisions=r.revisions,
        )
        for r in cut_plan.segments
    )
    return cut


_STEPS: dict[str, Callable[[ArchiveCut, Progress, Pause], None]] = {}


def _step(state_name: str) -> Callable[[Any], Any]:
    def register(fn: Any) -> Any:
        _STEPS[state_name] = fn
        return fn

    return register


def _run(cut: ArchiveCut, bars: Progress, stop: Pause) -> ArchiveCut:
    """Steps 2-6 from wherever ``cut`` stands."""
    while cut.state != CutState.REMOVED:
        _STEPS[cut.state](cut, bars, stop)
        cut.refresh_from_db()
    return cut


def _advance(cut: ArchiveCut, to: str, **fields: Any) -> None:
    ArchiveCut.objects.filter(pk=cut.pk).update(state=to, **fields)


@_step(CutState.PLANNED)
def _write(cut: ArchiveCut, bars: Progress, stop: Pause) -> None:
    """Step 2: each segment not yet stored, in seq order."""
    todo = list(cut.segments.filter(state=SegmentState.PLANNED).order_by("first_seq"))
    bar = bars(sum(s.changesets for s in todo), "changeset", f"write segments of cut {cut.seq}")
    for segment in todo:
        written = files.write(
            segment, prev=_chain_at(segment.first_seq - 1), on_changeset=bar.update
        )
        ArchiveSegment.objects.filter(pk=segment.pk).update(
            state=SegmentState.WRITTEN,
            digest=written.digest,
            bytes=written.size,
            namespaces=written.namespaces,
            written_at=timezone.now(),
        )
        stop("segment-written")
    bar.close()
    _advance(cut, CutState.WRITTEN)
    stop("written")


@_step(CutState.WRITTEN)
def _verify(cut: ArchiveCut, bars: Progress, stop: Pause) -> None:
    """Step 3: read every segment back, recompute the chain, build and compare the state."""
    previous = cut.from_seq - 1
    replay = state.Replay(base.rows_at(previous)) if previous else state.Replay()
    walk = chain.Start(seq=cut.from_seq, hash=cut.prev_hash, v1_hash=_chain_at(previous).v1_hash)
    stats = chain.Stats()
    bar = bars(cut.changesets, "changeset", f"verify segments of cut {cut.seq}")
    for segment in cut.segments.order_by("first_seq"):
        try:
            walk = files.verify(
                segment, prev=walk, replay=replay, stats=stats, on_changeset=bar.update
            )
        except files.NotVerified as exc:
            ArchiveSegment.objects.filter(pk=segment.pk).update(state=SegmentState.PLANNED)
            _advance(cut, CutState.PLANNED)
            raise ArchiveFailed(f"{exc}; run archive_log again to write it anew") from exc
        ArchiveSegment.objects.filter(pk=segment.pk).update(
            state=SegmentState.VERIFIED, verified_at=timezone.now()
        )
    bar.close()
    if (walk.seq - 1, walk.hash) != (cut.seq, cut.hash):
        raise ArchiveFailed(f"the segments end at seq {walk.seq - 1}, not at the cut's hash")
    base.build(cut=cut.seq, previous=previous)
    digest = base.digest_at(cut.seq)
    if digest != replay.digest():
        raise ArchiveFailed("the state built at the cut differs from the segments' (a bug)")
    _advance(cut, CutState.VERIFIED, state_digest=digest)
    stop("verified")


@_step(CutState.VERIFIED)
def _sign(cut: ArchiveCut, bars: Progress, stop: Pause) -> None:
    """Step 4, under the signing lock (``changesets.archive.erasure``)."""
    with transaction.atomic():
        locks.hold_signing()
        cut = ArchiveCut.objects.select_for_update().get(pk=cut.pk)
        rewrite.before_signing(cut)
        checkpoint.sign_and_store(cut)
        cut.state = CutState.SIGNED
        cut.save()
    rewrite.sweep()  # segments an erasure replaced before the signature
    stop("signed")


@_step(CutState.SIGNED)
def _switch(cut: ArchiveCut, bars: Progress, stop: Pause) -> None:
    """Step 5: reads end at the cut from now on (this process at once, others within
    ``ATLAS_ARCHIVE_CUT_CACHE_SECONDS``)."""
    _advance(cut, CutState.SWITCHED, switched_at=timezone.now())
    boundary.forget()
    stop("switched")


def grace_seconds() -> float:
    """How long removal waits after the switch: at least twice the readers' cache."""
    return max(
        float(conf.get("ATLAS_ARCHIVE_GRACE_SECONDS")),
        2 * float(conf.get("ATLAS_ARCHIVE_CUT_CACHE_SECONDS")),
    )


@_step(CutState.SWITCHED)
def _remove(cut: ArchiveCut, bars: Progress, stop: Pause) -> None:
    """Step 6: wait out the grace, remove the hot rows in batches, purge retired state."""
    assert cut.switched_at is not None
    wait = grace_seconds() - (timezone.now() - cut.switched_at).total_seconds()
    if wait > 0:
        time.sleep(wait)
    bar = bars(max(cut.revisions, 1), "revision", f"remove rows through seq {cut.seq}")

    def batch_done(last_seq: int, revisions: int) -> None:
        ArchiveCut.objects.filter(pk=cut.pk).update(removed_through=last_seq)
        bar.update(revisions)

    hot.remove_through(cut.seq, on_batch=_paused(batch_done, stop), on_step=stop)
    bar.close()
    base.purge(cut.seq)
    _advance(cut, CutState.REMOVED, removed_at=timezone.now(), removed_through=cut.seq)
    rewrite.run_pending()
    stop("removed")


def _paused(fn: Callable[[int, int], None], stop: Pause) -> Callable[[int, int], None]:
    def wrapped(last_seq: int, revisions: int) -> None:
        fn(last_seq, revisions)
        transaction.on_commit(lambda: stop("removal-batch"))

    return wrapped
