"""The tamper-evident log: a hash chain over changesets in seq order (v2).

Each changeset's ``hash`` is SHA-256 over the previous changeset's hash, a
canonical encoding of its own fields, and a digest of its revisions, so an
edit or deletion of any changeset or revision row, anywhere in the log,
breaks every hash from there on. ``verify_log`` recomputes the chain;
``GET /api/v1/log/head`` publishes the newest seq and hash so that others
can anchor it (keep a copy elsewhere; a rewritten log can't match it).

Why v2 commits to member digests, not images (docs/architecture.md, "A
chain that survives erasure"): an erasure must be able to destroy a value
and leave the rest of the log verifiable. So a revision's digest line holds,
for each top-level member of its before and after images, a salted digest
of that member's value, not the value:

1. Every revision row has a random 16-byte ``salt``.
2. Member ``name`` of side ``before``/``after`` has the key
   ``BLAKE2b-256(side + NUL + name, key=salt)``, and the digest
   ``BLAKE2b-256(canonical(value), key=key)`` (keyed BLAKE2b is a MAC). Keys
   are independent: knowing one member's key says nothing about another's,
   nor about the salt.
3. An erasure (``changesets.services.erase``) replaces the value with
   ``"[erased]"``, sets the salt to NULL and keeps, in ``sealed``, the digest
   of each erased member (``{"d": hex}``) and the key of every other member
   (``{"k": hex}``). The erased value can no longer be recomputed or
   brute-forced (its key is gone with the salt); every other member still is.

The revision digest is computed before the write takes the log head's lock,
so the serialized part of a commit only hashes a few hundred bytes.
``changesets.chainv1`` keeps the chain before erasure (migration 0018
re-chained v1 logs; each old changeset keeps its v1 hash, committed to in
its v2 header).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring as _encode_string
from typing import Any

from changesets import chainv1

GENESIS = "0" * 64
VERSION = b"atlas-chain-v2"
ERASED = "[erased]"
SALT_BYTES = 16
SIDES = ("before", "after")


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def new_salt() -> bytes:
    """A revision's salt: 16 random bytes (128 bits: no table of small values can cover it)."""
    return os.urandom(SALT_BYTES)


# One encoder, built once: ``json.dumps`` with options builds a new one per call,
# which is most of a member digest's cost. Same output as ``_canonical``.
_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def _encode(value: Any) -> str:
    """``_canonical(value)`` as text. Strings and integers, most members' values,
    skip the encoder's generic path (an integer through it costs seven times its
    ``repr``); the output is the encoder's own (``tests/changesets/test_chain_encoding.py``)."""
    kind = type(value)
    if kind is str:
        return _encode_string(value)
    if kind is int:
        return int.__repr__(value)
    return _encoder(value)


def member_key(salt: bytes, side: str, name: str) -> bytes:
    """The key of one member of one image (step 2 of the module docstring).

    Keyed BLAKE2b is a PRF/MAC by design (no length extension), and about
    three times faster than HMAC-SHA256 here, which matters: a write makes two
    of these per top-level member of each image.
    """
    return _member_keys(salt)(side, name)


def _member_keys(salt: bytes) -> Callable[[str, str], bytes]:
    """:func:`member_key` for one salt, for an image's many members: the keyed
    state is set up once and copied (a copy costs three quarters of a fresh keyed
    hash, which processes a whole block for the key). The key of member ``name`` of
    image ``side`` is ``BLAKE2b-256(side + NUL + name, key=salt)``."""
    keyed = hashlib.blake2b(key=salt, digest_size=32)

    def key(side: str, name: str) -> bytes:
        state = keyed.copy()
        state.update(f"{side}\0{name}".encode())
        return state.digest()

    return key


def member_digest(key: bytes, value: Any) -> str:
    return hashlib.blake2b(_encode(value).encode(), key=key, digest_size=32).hexdigest()


def image_digests(
    image: Mapping[str, Any] | None,
    *,
    side: str,
    salt: bytes | None,
    sealed: Mapping[str, Any] | None = None,
) -> dict[str, str] | None:
    """``{member: digest}`` of one image (None for an absent image).

    A sealed member (an erasure ran on the revision) uses its kept key, or,
    if the member was erased, its kept digest; otherwise the salt derives
    the key. A member that has neither (a row edited to add one) digests to
    an empty string, which never matches the chain.
    """
    if image is None:
        return None
    seal = (sealed or {}).get(side) or {}
    key = _member_keys(salt) if salt is not None else None
    out: dict[str, str] = {}
    for name, value in image.items():
        entry = seal.get(name)
        if entry is not None:
            kept = entry.get("d")
            out[name] = (
                kept
                if isinstance(kept, str)
                else member_digest(bytes.fromhex(entry.get("k", "")), value)
            )
        elif key is not None:
            out[name] = member_digest(key(side, name), value)
        else:
            out[name] = ""
    return out


def _salt(revision: Any) -> bytes | None:
    salt = getattr(revision, "salt", None)
    return None if salt is None else bytes(salt)


def revision_fields(revision: Any) -> list[Any]:
    """What the chain commits to for one revision row (its images as member digests)."""
    salt, sealed = _salt(revision), getattr(revision, "sealed", None)
    return [
        revision.namespace,
        revision.kind,
        revision.slug,
        str(revision.op),
        image_digests(revision.before, side="before", salt=salt, sealed=sealed),
        image_digests(revision.after, side="after", salt=salt, sealed=sealed),
        revision.before_version,
        revision.after_version,
        revision.branch,
    ]


def revisions_digest(revisions: Iterable[Any]) -> str:
    """Digest of a changeset's revisions, in the order they were written."""
    return digest_lines(_canonical(revision_fields(r)).decode() for r in revisions)


def revision_line(
    *,
    namespace: str,
    kind: str,
    slug: str,
    op: str,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
    salt: bytes,
    before_version: int | None,
    after_version: int | None,
    branch: str,
) -> str:
    """One revision's digest line as the write path makes it, before the row exists.

    The same encoding :func:`revision_fields` gives a stored row (``tests/
    changesets/test_write_path.py`` pins it byte for byte).
    """
    fields = [
        namespace,
        kind,
        slug,
        str(op),
        image_digests(before, side="before", salt=salt),
        image_digests(after, side="after", salt=salt),
        before_version,
        after_version,
        branch,
    ]
    return _canonical(fields).decode()


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
    # A changeset from before the re-chain (migration 0018) commits to its v1
    # hash, so a v1 anchor stays checkable whatever is erased later. Named so it
    # sorts between ``at`` and ``seq`` (``header_middle``); absent on new ones.
    v1 = getattr(changeset, "v1_hash", None)
    if v1:
        header["chain_v1"] = v1
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
    and ``middle`` (the text of :func:`header_middle`), as its 32 bytes (``bytea``,
    how the hash columns store it: ``changesets.fields.ChainHashField``).

    ``prev`` is the previous hash's hex text, since that text is what the
    header hashes. ``at`` is formatted as :func:`_timestamp` does (UTC,
    microseconds, ``+00:00``).
    """
    return (
        "sha256(convert_to("
        f"'{VERSION.decode()}' || {prev} || '{{\"at\":\"'"
        f" || to_char(({at}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
        f" || '+00:00\",' || {middle} || ',\"seq\":' || ({seq})::text || '}}',"
        " 'UTF8'))"
    )


@dataclass(frozen=True)
class Break:
    seq: int
    changeset_id: str | None
    reason: str


@dataclass
class Stats:
    """What :func:`verify` saw besides breaks: images with erased members, v1 hashes."""

    erased_images: int = 0
    erased_members: int = 0
    # (namespace, kind, slug, member) of every erased member seen: each must be
    # reached by a recorded erasure (``verify_log`` checks).
    erased: set[tuple[str, str, str, str]] = field(default_factory=set)
    v1_recomputed: int = 0
    v1_committed: int = 0
    v1_head: tuple[int, str] | None = None


def holds_erased(value: Any) -> bool:
    """Whether an erased member still shows its erasure (somewhere in it, ``"[erased]"``)."""
    if value == ERASED:
        return True
    if isinstance(value, dict):
        return any(holds_erased(v) for v in value.values())
    if isinstance(value, list):
        return any(holds_erased(v) for v in value)
    return False


def _erased_break(changeset: Any, revisions: list[Any], stats: Stats) -> Break | None:
    """Count erased images; an erased member must still read as erased."""
    for revision in revisions:
        sealed = getattr(revision, "sealed", None)
        if not sealed:
            continue
        for side in SIDES:
            image = getattr(revision, side)
            erased = [n for n, e in (sealed.get(side) or {}).items() if "d" in e]
            if erased:
                stats.erased_images += 1
                stats.erased_members += len(erased)
                key = (revision.namespace, revision.kind, revision.slug)
                stats.erased.update((*key, name) for name in erased)
            for name in erased:
                if image is None or name not in image or not holds_erased(image[name]):
                    return Break(
                        changeset.seq,
                        str(changeset.id),
                        f"revision {revision.pk}: {side} member {name!r} is sealed as erased"
                        " but does not read as erased",
                    )
    return None


def _v1_break(
    changeset: Any, revisions: list[Any], prev_v1: str | None, stats: Stats
) -> Break | None:
    """A pre-re-chain changeset's v1 hash: recomputed from its rows while none is erased
    (else taken as the v2 header commits to it); the v1 changesets are a prefix."""
    v1 = getattr(changeset, "v1_hash", None)
    if not v1:
        return None
    if changeset.seq > 1 and prev_v1 is None:
        return Break(changeset.seq, str(changeset.id), "a v1 hash after the v1 prefix ended")
    if any(getattr(r, "sealed", None) for r in revisions):
        stats.v1_committed += 1
    else:
        recomputed = chainv1.changeset_hash(
            prev_hash=prev_v1 or chainv1.GENESIS,
            changeset=changeset,
            revisions_hex=chainv1.revisions_digest(revisions),
        )
        if recomputed != v1:
            return Break(changeset.seq, str(changeset.id), "the v1 hash does not match the rows")
        stats.v1_recomputed += 1
    stats.v1_head = (changeset.seq, v1)
    return None


@dataclass(frozen=True)
class Start:
    """Where a walk starts: after ``seq - 1``, whose hash (and v1 hash) are known.

    ``Start()`` is the genesis; an archive checkpoint gives the start after its
    cut (``changesets.archive``), so the hot log verifies from there.
    """

    seq: int = 1
    hash: str = GENESIS
    v1_hash: str | None = None


def _rows_break(changeset: Any, revisions: list[Any], expected_seq: int, prev: str) -> Break | None:
    """The rows' own shape: the next seq, chained to the previous hash, every revision
    there, each with its changeset's seq, time and branch."""
    if changeset.seq != expected_seq:
        return Break(
            expected_seq,
            None,
            f"seq {expected_seq} is missing (next is {changeset.seq}): a changeset was removed",
        )
    # A changeset written since migration 0034 stores no prev_hash (it is the previous
    # row's hash); an older one does, and it must still chain. Either way the hash
    # recomputed below covers ``prev``.
    if changeset.prev_hash is not None and changeset.prev_hash != prev:
        return Break(changeset.seq, str(changeset.id), "prev_hash does not chain")
    if len(revisions) != changeset.op_count:
        return Break(
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
            return Break(
                changeset.seq,
                str(changeset.id),
                f"revision {revision.pk}'s seq, at or branch differs from its changeset's",
            )
    return None


def verify(
    changesets: Iterator[tuple[Any, list[Any]]],
    *,
    head: Any,
    stats: Stats | None = None,
    start: Start | None = None,
    digest_of: Callable[[Any, list[Any]], str] | None = None,
) -> tuple[int, Break | None]:
    """Walk ``(changeset, revisions)`` pairs in seq order; return (checked, first break).

    Checks that seqs are contiguous from ``start`` (seq 1 by default), that
    each ``prev_hash`` is the previous ``hash``, that each ``hash`` recomputes
    from the rows as they are now (erased members by their kept digests, which
    must still read as erased), that old changesets' v1 hashes chain
    (``_v1_break``), and that the log head names the last changeset (``head``
    None: not checked). ``stats`` collects counts. ``digest_of(changeset,
    revisions)`` gives the revisions' digest when the caller has computed it
    already (the archive's verifier: member digests are most of the cost).
    """
    stats = stats if stats is not None else Stats()
    start = start or Start()
    expected_seq, prev = start.seq, start.hash
    prev_v1: str | None = start.v1_hash
    checked = 0
    for changeset, revisions in changesets:
        broken = (
            _rows_break(changeset, revisions, expected_seq, prev)
            or _erased_break(changeset, revisions, stats)
            or _v1_break(changeset, revisions, prev_v1, stats)
        )
        if broken is not None:
            return checked, broken
        revisions_hex = (
            digest_of(changeset, revisions) if digest_of else revisions_digest(revisions)
        )
        computed = changeset_hash(prev_hash=prev, changeset=changeset, revisions_hex=revisions_hex)
        if computed != changeset.hash:
            return checked, Break(
                changeset.seq, str(changeset.id), "hash does not match the rows (edited)"
            )
        prev = changeset.hash
        prev_v1 = getattr(changeset, "v1_hash", None) or None
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


ERASURE_VERSION = b"atlas-erasure-v1"


def erasure_hash(*, prev_hash: str, erasure: Any) -> str:
    """An erasure record's link in the erasures' own chain (who, when, why, where; no values).

    Erasures destroy values the log chain can no longer recompute, so the
    records of them are chained too: a forged, edited or removed erasure
    record breaks this chain, which ``verify_log`` walks in id order.
    """
    body = {
        "id": str(erasure.id),
        "author": erasure.author_name,
        "at": _timestamp(erasure.at),
        "reason": erasure.reason,
        "targets": erasure.targets,
        "revisions_redacted": erasure.revisions_redacted,
        "changesets": [str(c) for c in erasure.changeset_ids],
    }
    digest = hashlib.sha256(ERASURE_VERSION)
    digest.update(prev_hash.encode())
    digest.update(_canonical(body))
    return digest.hexdigest()


def erasure_covers(targets: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(namespace, kind, slug, top-level member) that an erasure's targets reach."""
    covered = set()
    for t in targets:
        for pointer in t.get("pointers", []):
            first = pointer.split("/")[1] if pointer.count("/") else ""
            member = first.replace("~1", "/").replace("~0", "~")
            covered.add((t["namespace"], t["kind"], t["slug"], member))
    return covered
