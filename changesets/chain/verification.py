"""The walk that verifies the log: the rows' own shape, erased members, the v1
prefix and every hash recomputed (``verify_log``, the archive's verifiers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from changesets import chainv1
from changesets.chain.encoding import GENESIS
from changesets.chain.header import changeset_hash
from changesets.chain.members import ERASED, SIDES
from changesets.chain.revisions import revisions_digest


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
