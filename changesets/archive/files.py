"""A cut's segment files: written from the log, read back and verified.

Writing streams one segment's changesets out of PostgreSQL a chunk at a time
(``reader.pairs``) into a gzip file in a temporary local file, then stores it
under its name; memory follows a chunk, never a segment. Verifying reads the
stored file back through the storage (what is there, not what was meant to
be), checks its SHA-256 against the recorded one and recomputes the chain
across it (``changesets.archive.offline``), rolling the state forward.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any

from changesets import chain
from changesets.archive import offline, reader, segments, state, storage
from changesets.archive.models import ArchiveSegment


@dataclass(frozen=True)
class Written:
    digest: str
    size: int
    namespaces: list[str]


def write(segment: ArchiveSegment, *, prev: chain.Start, on_changeset: Any = None) -> Written:
    """Write ``segment``'s changesets to the archive storage under ``segment.name``."""
    namespaces: set[str] = set()
    with tempfile.TemporaryFile() as handle:
        writer = segments.SegmentWriter(handle)
        writer.write_lines(
            [
                segments.header_line(
                    first_seq=segment.first_seq,
                    last_seq=segment.last_seq,
                    prev_hash=prev.hash,
                    prev_v1_hash=prev.v1_hash,
                    changesets=segment.changesets,
                    revisions=segment.revisions,
                )
            ]
        )
        pairs = reader.pairs(segment.first_seq, segment.last_seq, prev_hash=prev.hash)
        for changeset, revisions in pairs:
            namespaces.update(changeset.namespaces)
            digest = chain.revisions_digest(revisions)
            writer.write_lines(segments.changeset_lines(changeset, revisions, revisions_hex=digest))
            if on_changeset is not None:
                on_changeset(1)
        digest, size = writer.close()
        storage.save(segment.name, handle)
    return Written(digest, size, sorted(namespaces))


class NotVerified(Exception):
    """A segment file is not what was written, or the chain does not recompute across it."""


def verify(
    segment: ArchiveSegment,
    *,
    prev: chain.Start,
    replay: state.Replay,
    stats: chain.Stats,
    on_changeset: Any = None,
) -> chain.Start:
    """Read ``segment`` back and verify it from ``prev``; the start of the next one.

    Uses the offline verifier's own walk, so the archiver and an auditor run
    the same checks on the same bytes.
    """
    entry = {
        "name": segment.name,
        "digest": segment.digest,
        "bytes": segment.bytes,
        "first_seq": segment.first_seq,
        "last_seq": segment.last_seq,
    }
    walk = offline.Walk(seq=prev.seq - 1, hash=prev.hash, v1_hash=prev.v1_hash, state=replay)
    report = offline.Report()
    source = storage.StorageSource()
    problem = offline.verify_segment(source, entry, walk, stats, report, on_changeset)
    if problem is not None:
        raise NotVerified(f"segment {segment.name}: {problem}")
    if (report.changesets, report.revisions) != (segment.changesets, segment.revisions):
        raise NotVerified(f"segment {segment.name} holds other rows than the plan counted")
    return chain.Start(seq=walk.seq + 1, hash=walk.hash, v1_hash=walk.v1_hash)
