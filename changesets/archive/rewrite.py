"""Erasures applied to archived segments: rewrite, re-sign, then delete the old files.

An erasure reaches the archive two ways (``changesets.archive.erasure``):

- a cut not yet signed takes every erasure newer than its watermark into its
  segments right before it signs (:func:`before_signing`, under the signing
  lock, so none slips between that look and the signature);
- a signed cut gets an ``ArchiveRewrite`` (pending) in the erasure's own
  transaction, carried out after it commits (:func:`run_pending`).

Either way a segment is rewritten exactly as the erase service rewrites a
revision row (``changesets.redaction.seal_revision``): the value becomes
``"[erased]"``, its member's digest stays in the seal, the salt goes. So every
chain hash, and the state digest, stay as signed; only the files' digests
change. Crash-safe order, each step repeatable:

1. write each changed segment under a new name (``.r<version>``) and read it
   back through the chain;
2. in one transaction: point the segment rows at the new files, bump the
   cut's version, sign and store the new checkpoint, mark the rewrite signed;
3. delete the old segment files and the older checkpoint versions, mark done.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from changesets import chain
from changesets.archive import checkpoint, offline, segments, state, storage
from changesets.archive.models import ArchiveCut, ArchiveRewrite, ArchiveSegment, RewriteState
from changesets.models import Erasure
from changesets.redaction import seal_revision

Targets = dict[tuple[str, str, str], list[str]]


def targets_of(erasures: Iterable[Erasure]) -> Targets:
    out: Targets = {}
    for erasure in erasures:
        for t in erasure.targets:
            pointers = out.setdefault((t["namespace"], t["kind"], t["slug"]), [])
            pointers += [p for p in t.get("pointers", []) if p not in pointers]
    return out


def _redacted_pairs(
    pairs: Iterable[tuple[Any, list[Any]]], targets: Targets, counter: list[int]
) -> Iterable[list[str]]:
    for changeset, revisions in pairs:
        for revision in revisions:
            pointers = targets.get((revision.namespace, revision.kind, revision.slug))
            if not pointers:
                continue
            update = seal_revision(
                revision.salt, revision.sealed, revision.before, revision.after, pointers, []
            )
            if update is not None:
                revision.before, revision.after = update["before"], update["after"]
                revision.sealed, revision.salt = update["sealed"], None
                counter[0] += 1
        yield segments.changeset_lines(changeset, revisions, revisions_hex=changeset.revisions_hex)


def rewrite_segment(
    segment: ArchiveSegment, targets: Targets, version: int
) -> dict[str, Any] | None:
    """Step 1 for one segment: its redacted copy stored and verified; None if untouched."""
    new_name = segments.segment_name(segment.first_seq, segment.last_seq, version)
    counter = [0]
    with storage.archive_storage().open(segment.name, "rb") as source:
        parsed = segments.read_segment(source)
        header = parsed.header
        with tempfile.TemporaryFile() as handle:
            writer = segments.SegmentWriter(handle)
            writer.write_lines([segments.header_line(**{k: header[k] for k in _HEADER})])
            for lines in _redacted_pairs(parsed.changesets, targets, counter):
                writer.write_lines(lines)
            digest, size = writer.close()
            if not counter[0]:
                return None
            storage.save(new_name, handle)
    entry = {
        "name": new_name,
        "digest": digest,
        "bytes": size,
        "first_seq": segment.first_seq,
        "last_seq": segment.last_seq,
    }
    walk = offline.Walk(
        seq=segment.first_seq - 1,
        hash=header["prev_hash"],
        v1_hash=header["prev_v1_hash"],
        state=state.Replay(),
    )
    problem = offline.verify_segment(
        storage.StorageSource(), entry, walk, chain.Stats(), offline.Report(), None
    )
    if problem is not None:
        storage.delete(new_name)
        raise RuntimeError(f"the rewrite of {segment.name} does not verify: {problem}")
    return {
        "old": segment.name,
        "new": new_name,
        "old_digest": segment.digest,
        "new_digest": digest,
        "bytes": size,
        "revisions": counter[0],
    }


_HEADER = ("first_seq", "last_seq", "prev_hash", "prev_v1_hash", "changesets", "revisions")


def rewrite_cut(cut: ArchiveCut, erasures: Sequence[Erasure]) -> list[dict[str, Any]]:
    """Step 1 for every segment of ``cut`` in a namespace the erasures reach."""
    targets = targets_of(erasures)
    namespaces = sorted({ns for ns, _, _ in targets})
    version = cut.rewrites + 1
    records = []
    for segment in cut.segments.filter(namespaces__overlap=namespaces).order_by("first_seq"):
        record = rewrite_segment(segment, targets, version)
        if record is not None:
            records.append(record)
    return records


def _point_rows_at(records: Sequence[dict[str, Any]]) -> None:
    for record in records:
        ArchiveSegment.objects.filter(name=record["old"]).update(
            name=record["new"], digest=record["new_digest"], bytes=record["bytes"]
        )


def _delete_old(cut: ArchiveCut, records: Sequence[dict[str, Any]]) -> None:
    """Step 3: the replaced files (which still hold the values) and older checkpoints."""
    for record in records:
        storage.delete(record["old"])
    for version in range(cut.rewrites):
        storage.delete(offline.checkpoint_name(cut.seq, version))


def before_signing(cut: ArchiveCut) -> int:
    """Take the erasures newer than the cut's watermark into its segments (not yet signed).

    Called inside the signing transaction, under the signing lock. Returns how
    many segments were rewritten.
    """
    newer = Erasure.objects.order_by("id")
    if cut.erasure_watermark is not None:
        newer = newer.filter(id__gt=cut.erasure_watermark)
    erasures = list(newer)
    if not erasures:
        return 0
    records = rewrite_cut(cut, erasures)
    _point_rows_at(records)
    if records:
        cut.rewrites += 1
    cut.erasure_watermark = erasures[-1].id
    cut.save(update_fields=["rewrites", "erasure_watermark"])
    return len(records)


def sweep() -> int:
    """Delete the files a rewrite replaced: older versions of this archive's own segments
    (they hold erased values) and of its checkpoints. Runs under the archiver's lock
    after each signing, so a crash between a commit and a delete leaves nothing behind
    for long. Files it did not write (another name, another range) are never touched.
    Returns how many files went."""
    source = storage.StorageSource()
    current = {(s.first_seq, s.last_seq): s.name for s in ArchiveSegment.objects.only(
        "first_seq", "last_seq", "name"
    )}  # fmt: skip
    versions = dict(ArchiveCut.objects.exclude(signature="").values_list("seq", "rewrites"))
    gone = []
    for name in source.names("segments"):
        match = _SEGMENT_NAME.match(name)
        if match and current.get((int(match[1]), int(match[2])), name) != name:
            gone.append(name)
    for name in source.names(offline.CHECKPOINTS):
        match = _CHECKPOINT_NAME.match(name)
        if match and int(match[1]) in versions and int(match[2]) < versions[int(match[1])]:
            gone.append(name)
    for name in gone:
        storage.delete(name)
    return len(gone)


_SEGMENT_NAME = re.compile(r"^segments/(\d{12})-(\d{12})(?:\.r\d+)?\.ndjson\.gz$")
_CHECKPOINT_NAME = re.compile(r"^checkpoints/(\d{12})\.v(\d+)\.json$")


def run_pending() -> int:
    """Carry out every pending rewrite (steps 1-3), oldest first; the caller holds the
    archiver's lock. Also finishes step 3 of rewrites a crash left signed."""
    done = 0
    for rewrite in ArchiveRewrite.objects.exclude(state=RewriteState.DONE).order_by("id"):
        cut = ArchiveCut.objects.get(pk=rewrite.cut_id)
        if rewrite.state == RewriteState.PENDING:
            erasure = Erasure.objects.get(pk=rewrite.erasure_id)
            records = rewrite_cut(cut, [erasure])
            with transaction.atomic():
                cut = ArchiveCut.objects.select_for_update().get(pk=cut.pk)
                _point_rows_at(records)
                cut.rewrites += 1
                checkpoint.sign_and_store(cut)
                cut.save()
                rewrite.segments, rewrite.state = records, RewriteState.SIGNED
                rewrite.save(update_fields=["segments", "state"])
        _delete_old(cut, rewrite.segments)
        rewrite.state, rewrite.done_at = RewriteState.DONE, timezone.now()
        rewrite.save(update_fields=["state", "done_at"])
        done += 1
    if done:
        sweep()
    return done
