"""Archive segments: the NDJSON export format, gzipped, with each row's chain material.

Pure Python (no Django): the archiver writes segments with it and the offline
verifier (:mod:`changesets.archive.offline`) reads them, so an auditor needs
only the files, the public key and this package. A segment is:

1. A header line: ``{"atlas_archive_segment": 1, "first_seq", "last_seq",
   "prev_hash", "prev_v1_hash", "changesets", "revisions"}`` (``prev_hash``:
   the chain hash at ``first_seq - 1``; ``prev_v1_hash`` its v1 hash inside
   the v1 prefix, else null), so each segment verifies on its own.
2. Per changeset, in seq order, what ``GET /changesets/{id}/export`` gives
   (API.md "NDJSON export/import", schema_version 2): the envelope line, then
   one line per op in write order. Each line adds a ``"chain"`` object with
   what the hash chain commits to and the export leaves out or rounds: on the
   envelope ``seq``, ``at`` to the microsecond, ``message``, ``op_count``,
   ``namespaces``, the exact ``metadata`` (null stays null), ``prev_hash``,
   ``hash``, ``v1_hash`` and ``revisions`` (the digest of its revisions that
   its header commits to); on an op ``before_version``, ``after_version``, the
   revision's ``salt`` (hex) and ``sealed`` (its erasure seal).

With those, ``changesets.chain`` recomputes every hash from the segment alone.
The file is gzip (``mtime`` 0, so equal content gives equal bytes); its
digest is the SHA-256 of the gzip bytes, which the checkpoint signs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import IO, Any

FORMAT = 1
HEADER_KEY = "atlas_archive_segment"
SCHEMA_VERSION = 2  # the NDJSON export's (changesets.ndjson.SCHEMA_VERSION)
ENVELOPE_KEYS = {
    "schema_version",
    "changeset_id",
    "author",
    "at",
    "rpc",
    "branch",
    "comment",
    "metadata",
    "context",
    "chain",
}
OP_KEYS = {"op", "namespace", "kind", "slug", "before", "after", "changed", "chain"}
CHANGESET_CHAIN_KEYS = {
    "seq",
    "at",
    "message",
    "op_count",
    "namespaces",
    "metadata",
    "prev_hash",
    "hash",
    "v1_hash",
    "revisions",
}
REVISION_CHAIN_KEYS = {"before_version", "after_version", "salt", "sealed"}
HEADER_KEYS = {
    HEADER_KEY,
    "first_seq",
    "last_seq",
    "prev_hash",
    "prev_v1_hash",
    "changesets",
    "revisions",
}


class SegmentError(Exception):
    """A segment that is not well formed (names the line, 1-based)."""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _ms(at: datetime) -> str:
    """RFC 3339 UTC with milliseconds, as the export shows times (``atlas.api.render``)."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _us(at: datetime) -> str:
    """The time the chain hashes (``changesets.chain.encoding._timestamp``)."""
    return at.astimezone(UTC).isoformat(timespec="microseconds")


def segment_name(first_seq: int, last_seq: int, version: int = 0) -> str:
    """``segments/<first>-<last>.ndjson.gz``; a rewrite after an erasure adds ``.r<n>``."""
    suffix = f".r{version}" if version else ""
    return f"segments/{first_seq:012d}-{last_seq:012d}{suffix}.ndjson.gz"


def header_line(
    *,
    first_seq: int,
    last_seq: int,
    prev_hash: str,
    prev_v1_hash: str | None,
    changesets: int,
    revisions: int,
) -> str:
    return _dumps(
        {
            HEADER_KEY: FORMAT,
            "first_seq": first_seq,
            "last_seq": last_seq,
            "prev_hash": prev_hash,
            "prev_v1_hash": prev_v1_hash,
            "changesets": changesets,
            "revisions": revisions,
        }
    )


def changeset_lines(changeset: Any, revisions: Iterable[Any], *, revisions_hex: str) -> list[str]:
    """The envelope and op lines of one changeset (objects with the models' attributes)."""
    salt_of = _salt_hex
    lines = [
        _dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "changeset_id": str(changeset.id),
                "author": changeset.author_name,
                "at": _ms(changeset.at),
                "rpc": str(changeset.rpc),
                "branch": changeset.branch,
                "comment": changeset.comment,
                "metadata": changeset.metadata or {},
                "context": changeset.context,
                "chain": {
                    "seq": changeset.seq,
                    "at": _us(changeset.at),
                    "message": changeset.message,
                    "op_count": changeset.op_count,
                    "namespaces": list(changeset.namespaces),
                    "metadata": changeset.metadata,
                    "prev_hash": changeset.prev_hash,
                    "hash": changeset.hash,
                    "v1_hash": getattr(changeset, "v1_hash", None) or None,
                    "revisions": revisions_hex,
                },
            }
        )
    ]
    for revision in revisions:
        lines.append(
            _dumps(
                {
                    "op": str(revision.op),
                    "namespace": revision.namespace,
                    "kind": revision.kind,
                    "slug": revision.slug,
                    "before": revision.before,
                    "after": revision.after,
                    "changed": list(revision.changed or []),
                    "chain": {
                        "before_version": revision.before_version,
                        "after_version": revision.after_version,
                        "salt": salt_of(revision),
                        "sealed": revision.sealed,
                    },
                }
            )
        )
    return lines


def _salt_hex(revision: Any) -> str | None:
    salt = getattr(revision, "salt", None)
    return None if salt is None else bytes(salt).hex()


class _Hashing(io.RawIOBase):
    """A write-only file that passes bytes on and hashes and counts them."""

    def __init__(self, target: IO[bytes]) -> None:
        self.target, self.sha, self.size = target, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.target.write(chunk)
        self.sha.update(chunk)
        self.size += len(chunk)
        return len(chunk)


class SegmentWriter:
    """Writes one segment's lines, gzipped, into ``target``; ``close`` returns (sha256, bytes)."""

    def __init__(self, target: IO[bytes]) -> None:
        self._hashing = _Hashing(target)
        self._gzip = gzip.GzipFile(fileobj=self._hashing, mode="wb", mtime=0, compresslevel=6)

    def write_lines(self, lines: Iterable[str]) -> None:
        self._gzip.write("".join(line + "\n" for line in lines).encode())

    def close(self) -> tuple[str, int]:
        self._gzip.close()
        return self._hashing.sha.hexdigest(), self._hashing.size


def file_digest(handle: IO[bytes]) -> tuple[str, int]:
    """SHA-256 (hex) and size of a file's bytes, read in chunks."""
    sha, size = hashlib.sha256(), 0
    while chunk := handle.read(1 << 20):
        sha.update(chunk)
        size += len(chunk)
    return sha.hexdigest(), size


# --- reading -------------------------------------------------------------------------


@dataclass
class Segment:
    """A parsed segment: its header, then ``(changeset, revisions)`` pairs as they come."""

    header: dict[str, Any]
    changesets: Iterator[tuple[SimpleNamespace, list[SimpleNamespace]]]


def _fail(line: int, detail: str) -> SegmentError:
    return SegmentError(f"line {line}: {detail}")


def _keys(obj: dict[str, Any], expected: set[str], line: int, what: str) -> None:
    if set(obj) != expected:
        unknown, missing = sorted(set(obj) - expected), sorted(expected - set(obj))
        raise _fail(line, f"{what}: unknown {unknown}, missing {missing}")


def _load(raw: bytes, line: int) -> dict[str, Any]:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _fail(line, f"not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise _fail(line, "not a JSON object")
    return obj


def read_segment(handle: IO[bytes]) -> Segment:
    """Parse a gzipped segment from ``handle``; pairs are read lazily, checked line by line."""
    stream = gzip.GzipFile(fileobj=handle, mode="rb")
    try:
        first = stream.readline()
    except (OSError, EOFError) as exc:
        raise SegmentError(f"not a gzip file ({exc})") from exc
    header = _load(first, 1)
    _keys(header, HEADER_KEYS, 1, "header")
    if header[HEADER_KEY] != FORMAT:
        raise _fail(1, f"unknown segment format {header[HEADER_KEY]!r}")
    return Segment(header, _pairs(stream))


def _pairs(stream: Any) -> Iterator[tuple[SimpleNamespace, list[SimpleNamespace]]]:
    current: SimpleNamespace | None = None
    revisions: list[SimpleNamespace] = []
    number = 1
    try:
        for raw in stream:
            number += 1
            obj = _load(raw, number)
            if "schema_version" in obj:
                if current is not None:
                    yield current, revisions
                current, revisions = _changeset(obj, number), []
            elif current is None:
                raise _fail(number, "an op line before any envelope")
            else:
                revisions.append(_revision(obj, number, current, len(revisions)))
    except (OSError, EOFError) as exc:
        raise _fail(number, f"the gzip stream is damaged ({exc})") from exc
    if current is not None:
        yield current, revisions


def _changeset(obj: dict[str, Any], line: int) -> SimpleNamespace:
    _keys(obj, ENVELOPE_KEYS, line, "envelope")
    chain = obj["chain"]
    if not isinstance(chain, dict):
        raise _fail(line, "chain must be an object")
    _keys(chain, CHANGESET_CHAIN_KEYS, line, "envelope chain")
    try:
        at = datetime.fromisoformat(chain["at"])
    except (TypeError, ValueError) as exc:
        raise _fail(line, "chain.at is not a timestamp") from exc
    return SimpleNamespace(
        id=obj["changeset_id"],
        seq=chain["seq"],
        author_name=obj["author"],
        at=at,
        message=chain["message"],
        comment=obj["comment"],
        branch=obj["branch"],
        rpc=obj["rpc"],
        op_count=chain["op_count"],
        namespaces=chain["namespaces"],
        metadata=chain["metadata"],
        context=obj["context"],
        prev_hash=chain["prev_hash"],
        hash=chain["hash"],
        v1_hash=chain["v1_hash"],
        revisions_hex=chain["revisions"],
        line=line,
    )


def _revision(
    obj: dict[str, Any], line: int, changeset: SimpleNamespace, index: int
) -> SimpleNamespace:
    _keys(obj, OP_KEYS, line, "op")
    chain = obj["chain"]
    if not isinstance(chain, dict):
        raise _fail(line, "chain must be an object")
    _keys(chain, REVISION_CHAIN_KEYS, line, "op chain")
    try:
        salt = None if chain["salt"] is None else bytes.fromhex(chain["salt"])
    except (TypeError, ValueError) as exc:
        raise _fail(line, "chain.salt is not hex") from exc
    return SimpleNamespace(
        pk=f"{changeset.seq}.{index}",
        changeset_id=changeset.id,
        seq=changeset.seq,
        at=changeset.at,
        branch=changeset.branch,
        op=obj["op"],
        namespace=obj["namespace"],
        kind=obj["kind"],
        slug=obj["slug"],
        before=obj["before"],
        after=obj["after"],
        changed=obj["changed"],
        before_version=chain["before_version"],
        after_version=chain["after_version"],
        salt=salt,
        sealed=chain["sealed"],
        line=line,
    )
