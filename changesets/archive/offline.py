"""Verify an archive from its files alone: no database, no Django, only the public key.

    python -m changesets.archive.offline DIR [--public-key KEY ...]

(``manage.py verify_archive`` runs the same code, also on the configured
storage.) For every checkpoint, oldest first:

1. Its signature verifies under a trusted public key (``--public-key``,
   repeatable for rotated keys; without one, the key written in the
   checkpoint file, which only proves the files agree with each other).
2. It continues the previous one: ``from_seq`` is the previous ``seq + 1``
   and ``prev_hash`` its ``hash`` (the first starts at seq 1 from the genesis).
3. Its segments cover ``from_seq..seq`` in order; each file's SHA-256 and size
   are the signed ones.
4. The hash chain recomputes from the segments (``changesets.chain.verify``):
   every changeset's hash from its fields and its revisions' member digests,
   each ``prev_hash`` the previous hash, ending at the checkpoint's ``hash``.
5. The baseline state at the cut, replayed from every segment so far
   (``changesets.archive.state``), has the signed ``state_digest``.
6. Every erased member in the segments is covered by an erasure the
   checkpoint lists (each lists digests of the members it covers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from changesets import chain
from changesets.archive import segments, signing, state

CHECKPOINTS = "checkpoints"


class Source(Protocol):
    """Where the archive's files are: a directory here, Django storage in ``.storage``."""

    def names(self, folder: str) -> list[str]: ...

    def open(self, name: str) -> IO[bytes]: ...

    def exists(self, name: str) -> bool: ...


class DirectorySource:
    """An archive copied to a local folder (what an auditor has)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def names(self, folder: str) -> list[str]:
        path = self.root / folder
        return sorted(f"{folder}/{p.name}" for p in path.iterdir()) if path.is_dir() else []

    def open(self, name: str) -> IO[bytes]:
        return (self.root / name).open("rb")

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()


def cover_digest(member: tuple[str, str, str, str]) -> str:
    """An erased member as a checkpoint lists it: SHA-256 of ``[namespace, kind, slug,
    member]`` as compact JSON (the entity's names stay out of the published body)."""
    text = json.dumps(list(member), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint_name(seq: int, version: int) -> str:
    return f"{CHECKPOINTS}/{seq:012d}.v{version}.json"


def load_checkpoints(source: Source) -> list[dict[str, Any]]:
    """The newest version of each checkpoint file, oldest cut first."""
    newest: dict[int, tuple[int, str]] = {}
    for name in source.names(CHECKPOINTS):
        stem = name.rsplit("/", 1)[-1]
        seq_text, _, rest = stem.partition(".v")
        version_text = rest.removesuffix(".json")
        if not (seq_text.isdigit() and version_text.isdigit() and rest.endswith(".json")):
            continue
        seq, version = int(seq_text), int(version_text)
        if seq not in newest or newest[seq][0] < version:
            newest[seq] = (version, name)
    out = []
    for seq in sorted(newest):
        with source.open(newest[seq][1]) as handle:
            out.append(json.loads(handle.read().decode("utf-8")))
    return out


@dataclass
class Report:
    """What verification saw; ``problems`` empty means the archive verifies."""

    checkpoints: int = 0
    segments: int = 0
    changesets: int = 0
    revisions: int = 0
    erased_members: int = 0
    head_seq: int = 0
    head_hash: str = chain.GENESIS
    keys: str = "trusted"
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class Walk:
    """What a checkpoint's walk carries to the next: the chain's end and the state."""

    seq: int = 0
    hash: str = chain.GENESIS
    v1_hash: str | None = None
    state: state.Replay = field(default_factory=state.Replay)


def verify_archive(
    source: Source,
    *,
    public_keys: list[str] | None = None,
    progress: Callable[[int], Any] | None = None,
) -> Report:
    """Steps 1-6 of the module docstring over every checkpoint in ``source``."""
    report = Report(keys="trusted" if public_keys else "embedded (untrusted)")
    trusted = [signing.load_public_key(k) for k in public_keys or []]
    walk = Walk()
    for checkpoint in load_checkpoints(source):
        report.checkpoints += 1
        problems = _verify_checkpoint(source, checkpoint, trusted, walk, report, progress)
        if problems:
            report.problems += [f"checkpoint seq {checkpoint.get('seq')}: {p}" for p in problems]
            return report
    report.head_seq, report.head_hash = walk.seq, walk.hash
    if not report.checkpoints:
        report.problems.append("no checkpoint files under checkpoints/")
    return report


def _signature_problem(checkpoint: dict[str, Any], trusted: list[Any]) -> str | None:
    keys = trusted
    if not keys:
        try:
            keys = [signing.load_public_key(str(checkpoint.get("public_key", "")))]
        except signing.BadKey as exc:
            return f"its public key cannot be read ({exc})"
    if not any(signing.verify(checkpoint, key) for key in keys):
        return "the signature does not verify"
    return None


def _verify_checkpoint(
    source: Source,
    checkpoint: dict[str, Any],
    trusted: list[Any],
    walk: Walk,
    report: Report,
    progress: Callable[[int], Any] | None,
) -> list[str]:
    """One checkpoint (steps 1-6); ``walk`` moves to its end when it verifies."""
    problem = _signature_problem(checkpoint, trusted)
    if problem:
        return [problem]
    if checkpoint.get("from_seq") != walk.seq + 1 or checkpoint.get("prev_hash") != walk.hash:
        return [f"does not continue the chain at seq {walk.seq} (hash {walk.hash[:12]}…)"]
    stats = chain.Stats()
    expected = walk.seq + 1
    for entry in checkpoint.get("segments", []):
        if entry.get("first_seq") != expected:
            return [
                f"segment {entry.get('name')} starts at {entry.get('first_seq')}, not {expected}"
            ]
        problem = verify_segment(source, entry, walk, stats, report, progress)
        if problem:
            return [f"segment {entry.get('name')}: {problem}"]
        report.segments += 1
        expected = entry["last_seq"] + 1
    problems = []
    if (walk.seq, walk.hash) != (checkpoint.get("seq"), checkpoint.get("hash")):
        problems.append(
            f"the segments end at seq {walk.seq} hash {walk.hash[:12]}…, not the checkpoint's"
        )
    if walk.state.digest() != checkpoint.get("state_digest"):
        problems.append("the state at the cut does not match state_digest")
    covered = {c for erasure in checkpoint.get("erasures", []) for c in erasure.get("covers", [])}
    stray = sorted(member for member in stats.erased if cover_digest(member) not in covered)
    if stray:
        problems.append(f"{len(stray)} erased member(s) no listed erasure covers: {stray[:3]}")
    report.erased_members += stats.erased_members
    return problems


def verify_segment(
    source: Source,
    entry: dict[str, Any],
    walk: Walk,
    stats: chain.Stats,
    report: Report,
    progress: Callable[[int], Any] | None,
) -> str | None:
    """One segment file (steps 3-5); moves ``walk`` to its last changeset."""
    name = str(entry.get("name", ""))
    if not source.exists(name):
        return "the file is missing"
    with source.open(name) as handle:
        digest, size = segments.file_digest(handle)
    if digest != entry.get("digest") or size != entry.get("bytes"):
        return "its SHA-256 or size is not the signed one"
    with source.open(name) as handle:
        try:
            segment = segments.read_segment(handle)
            header = segment.header
            if (
                header["first_seq"],
                header["last_seq"],
                header["prev_hash"],
                header["prev_v1_hash"],
            ) != (entry["first_seq"], entry["last_seq"], walk.hash, walk.v1_hash):
                return "its header does not match the checkpoint"
            seen = _Seen()
            start = chain.Start(seq=walk.seq + 1, hash=walk.hash, v1_hash=walk.v1_hash)
            pairs = seen.watch(segment.changesets, walk.state, progress)
            checked, broken = chain.verify(
                pairs, head=None, stats=stats, start=start, digest_of=seen.digest_of
            )
        except segments.SegmentError as exc:
            return str(exc)
    if broken is not None:
        return f"the chain breaks at seq {broken.seq}: {broken.reason}"
    if seen.digest_mismatch is not None:
        return f"seq {seen.digest_mismatch}: its revisions digest is not the one written beside it"
    if checked != header["changesets"] or seen.revisions != header["revisions"]:
        return "it holds another number of changesets or revisions than its header says"
    if seen.last is None or seen.last.seq != entry["last_seq"]:
        return "it ends before its last seq"
    walk.seq, walk.hash = seen.last.seq, seen.last.hash
    walk.v1_hash = seen.last.v1_hash or None
    report.changesets += checked
    report.revisions += seen.revisions
    return None


class _Seen:
    """Watches the pairs the chain walks: counts, the last changeset, the state, digests."""

    @staticmethod
    def digest_of(changeset: Any, revisions: list[Any]) -> str:
        return str(changeset.computed_hex)

    def __init__(self) -> None:
        self.last: Any = None
        self.revisions = 0
        self.digest_mismatch: int | None = None

    def watch(
        self,
        pairs: Iterator[tuple[Any, list[Any]]],
        replay: state.Replay,
        progress: Callable[[int], Any] | None,
    ) -> Iterator[tuple[Any, list[Any]]]:
        for changeset, revisions in pairs:
            # Each revision's chain fields once: for the digest the chain checks, the one
            # written beside it, and the state (member digests are most of the cost).
            fields = [chain.revision_fields(r) for r in revisions]
            changeset.computed_hex = chain.digest_lines(
                json.dumps(f, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                for f in fields
            )
            if self.digest_mismatch is None and changeset.computed_hex != changeset.revisions_hex:
                self.digest_mismatch = changeset.seq
            for revision, revision_fields in zip(revisions, fields, strict=True):
                replay.apply(revision, revision_fields)
            self.revisions += len(revisions)
            self.last = changeset
            if progress is not None:
                progress(1)
            yield changeset, revisions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("location", help="a folder holding checkpoints/ and segments/")
    parser.add_argument("--public-key", action="append", default=[], help="trusted key (base64)")
    args = parser.parse_args(argv)
    report = verify_archive(DirectorySource(args.location), public_keys=args.public_key)
    print(summary(report))
    return 0 if report.ok else 1


def summary(report: Report) -> str:
    if not report.ok:
        return "BROKEN: " + "; ".join(report.problems)
    return (
        f"ok: {report.checkpoints} checkpoint(s), {report.segments} segment(s),"
        f" {report.changesets} changeset(s), {report.revisions} revision(s) verified through"
        f" seq {report.head_seq} hash {report.head_hash}; {report.erased_members} erased"
        f" member(s); signatures checked against {report.keys} key(s)"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
