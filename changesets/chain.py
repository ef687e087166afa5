"""The tamper-evident log: a hash chain over changesets in seq order.

Each changeset's ``hash`` is SHA-256 over the previous changeset's hash, a
canonical encoding of its own fields, and a digest of its revisions, so an
edit or deletion of any changeset or revision row, anywhere in the log,
breaks every hash from there on. ``verify_log`` recomputes the chain;
``GET /api/v1/log/head`` publishes the newest seq and hash so that others
can anchor it (keep a copy elsewhere; a rewritten log can't match it).

The revision digest is computed before the write takes the log head's lock,
so the serialized part of a commit only hashes a few hundred bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

GENESIS = "0" * 64
VERSION = b"atlas-chain-v1"


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def revision_fields(revision: Any) -> list[Any]:
    return [
        revision.namespace,
        revision.kind,
        revision.slug,
        str(revision.op),
        revision.before,
        revision.after,
        revision.before_version,
        revision.after_version,
        revision.branch,
    ]


def revisions_digest(revisions: Iterable[Any]) -> str:
    """Digest of a changeset's revisions, in the order they were written."""
    digest = hashlib.sha256(VERSION)
    for revision in revisions:
        digest.update(_canonical(revision_fields(revision)))
        digest.update(b"\n")
    return digest.hexdigest()


def _text(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _int(value: int | None) -> str:
    return "null" if value is None else str(int(value))


def revision_line(
    *,
    namespace: str,
    kind: str,
    slug: str,
    op: str,
    before_text: str | None,
    after_text: str | None,
    before_version: int | None,
    after_version: int | None,
    branch: str,
) -> str:
    """One revision's digest line, ``_canonical(revision_fields(r))``, from images
    already in :func:`changesets.ops.canonical` form (the write path serializes each
    image once and reuses the text for the row and the digest). ``tests/changesets/
    test_write_path.py`` pins it byte for byte to the form ``verify`` recomputes."""
    return (
        f"[{_text(namespace)},{_text(kind)},{_text(slug)},{_text(str(op))},"
        f"{'null' if before_text is None else before_text},"
        f"{'null' if after_text is None else after_text},"
        f"{_int(before_version)},{_int(after_version)},{_text(branch)}]"
    )


def digest_lines(lines: Iterable[str]) -> str:
    """:func:`revisions_digest` over lines made by :func:`revision_line`."""
    digest = hashlib.sha256(VERSION)
    digest.update("".join(line + "\n" for line in lines).encode())
    return digest.hexdigest()


def _timestamp(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def _header_rest(changeset: Any, revisions_hex: str) -> dict[str, Any]:
    """The header's members other than ``at`` and ``seq`` (the two the log head hands out).

    ``metadata`` and ``context`` (provenance, migration 0015) are members only
    when the changeset has them: a changeset written before them hashes as it
    always did, and setting, changing or removing either on any changeset
    changes its header, so ``verify_log`` sees it. Both sort between ``at``
    and ``seq``, so :func:`header_middle` carries them.
    """
    header = {
        "id": str(changeset.id),
        "author": changeset.author_name,
        "message": changeset.message,
        "comment": changeset.comment,
        "branch": changeset.branch,
        "rpc": str(changeset.rpc),
        "op_count": changeset.op_count,
        "namespaces": list(changeset.namespaces),
        "revisions": revisions_hex,
    }
    for name in ("metadata", "context"):
        value = getattr(changeset, name, None)
        if value is not None:
            header[name] = value
    return header


def changeset_hash(*, prev_hash: str, changeset: Any, revisions_hex: str) -> str:
    header = {
        **_header_rest(changeset, revisions_hex),
        "seq": changeset.seq,
        "at": _timestamp(changeset.at),
    }
    digest = hashlib.sha256(VERSION)
    digest.update(prev_hash.encode())
    digest.update(_canonical(header))
    return digest.hexdigest()


def header_middle(changeset: Any, revisions_hex: str) -> str:
    """The canonical header without its first member (``at``) and its last (``seq``).

    The write path has PostgreSQL compute the hash in the statement that draws
    ``seq`` and ``at`` (:func:`hash_sql`), so the log head's lock is taken and
    released without a round trip to Python in between. With sorted keys
    ``at`` sorts first and ``seq`` last, so the header PostgreSQL hashes is
    ``{"at":"<at>",`` + this + ``,"seq":<seq>}``, byte for byte what
    :func:`changeset_hash` hashes (``tests/changesets/test_chain.py`` pins it).
    """
    return _canonical(_header_rest(changeset, revisions_hex)).decode()[1:-1]


def hash_sql(*, prev: str, at: str, seq: str, middle: str) -> str:
    """SQL for :func:`changeset_hash` of SQL expressions ``prev``, ``at``, ``seq``
    and ``middle`` (the text of :func:`header_middle`).

    ``at`` is formatted as :func:`_timestamp` does (UTC, microseconds, ``+00:00``).
    """
    return (
        "encode(sha256(convert_to("
        f"'{VERSION.decode()}' || {prev} || '{{\"at\":\"'"
        f" || to_char(({at}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
        f" || '+00:00\",' || {middle} || ',\"seq\":' || ({seq})::text || '}}',"
        " 'UTF8')), 'hex')"
    )


@dataclass(frozen=True)
class Break:
    seq: int
    changeset_id: str | None
    reason: str


def verify(changesets: Iterator[tuple[Any, list[Any]]], *, head: Any) -> tuple[int, Break | None]:
    """Walk ``(changeset, revisions)`` pairs in seq order; return (checked, first break).

    Checks that seqs are contiguous from 1, that each ``prev_hash`` is the
    previous ``hash``, that each ``hash`` recomputes from the rows as they are
    now, and that the log head names the last changeset.
    """
    expected_seq, prev = 1, GENESIS
    checked = 0
    for changeset, revisions in changesets:
        if changeset.seq != expected_seq:
            return checked, Break(
                expected_seq,
                None,
                f"seq {expected_seq} is missing (next is {changeset.seq}): a changeset was removed",
            )
        if changeset.prev_hash != prev:
            return checked, Break(changeset.seq, str(changeset.id), "prev_hash does not chain")
        if len(revisions) != changeset.op_count:
            return checked, Break(
                changeset.seq,
                str(changeset.id),
                f"{len(revisions)} revision rows, op_count says {changeset.op_count}",
            )
        for revision in revisions:
            if (revision.seq, revision.at, revision.branch) != (
                changeset.seq,
                changeset.at,
                changeset.branch,
            ):
                return checked, Break(
                    changeset.seq,
                    str(changeset.id),
                    f"revision {revision.pk}'s seq, at or branch differs from its changeset's",
                )
        computed = changeset_hash(
            prev_hash=prev, changeset=changeset, revisions_hex=revisions_digest(revisions)
        )
        if computed != changeset.hash:
            return checked, Break(
                changeset.seq, str(changeset.id), "hash does not match the rows (edited)"
            )
        prev = changeset.hash
        expected_seq += 1
        checked += 1
    if head is not None:
        if head.seq != expected_seq - 1:
            return checked, Break(
                head.seq,
                None,
                f"the log head says seq {head.seq}; the log ends at {expected_seq - 1}",
            )
        if checked and head.hash != prev:
            return checked, Break(head.seq, None, "the log head's hash is not the last changeset's")
    return checked, None
