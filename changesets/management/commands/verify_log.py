"""Recompute the changeset log's hash chain and report the first break.

    manage.py verify_log [--no-progress] [--v1-anchor SEQ:HASH ...]

Exits 0 when every changeset and revision is as written (erased members by
the digests their erasure kept), 1 at the first changeset whose rows no longer
match (edited, removed, or reordered). Also checks the erasures' own chain,
that every erased member is reached by a recorded erasure, that the v1 hashes
of changesets from before the re-chain (migration 0018) still chain up to the
recorded cut, and each ``--v1-anchor`` (a ``seq:hash`` someone anchored from
``GET /log/head`` before the re-chain).

After an archive cut (docs/retention.md) the walk starts from the newest
checkpoint: its signature must verify, the state at the cut must have the
digest it signs, and the first changeset after the cut must chain to the
checkpoint's hash; from there on, as above. What lies before the cut is
checked by ``verify_archive`` on the segments.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from tqdm import tqdm

from changesets import chain
from changesets.archive import base, checkpoint
from changesets.archive.models import ACTIVE_STATES, ArchiveCut
from changesets.models import ChainUpgrade, Changeset, Erasure, LogHead, Revision

CHUNK = 500


def _pairs(bar: tqdm, after: int = 0) -> Iterator[tuple[Changeset, list[Revision]]]:
    """(changeset, its revisions in write order) after seq ``after``, a chunk at a time."""
    while True:
        chunk = list(Changeset.objects.filter(seq__gt=after).order_by("seq")[:CHUNK])
        if not chunk:
            return
        # By the chunk's seqs (the revision table's partition key and index lead): a
        # revision whose seq was moved out of them leaves its changeset a row short.
        revisions = Revision.objects.filter(
            seq__gte=chunk[0].seq, seq__lte=chunk[-1].seq, changeset__in=chunk
        ).order_by("changeset_id", "id")
        by_changeset = {k: list(g) for k, g in groupby(revisions, key=lambda r: r.changeset_id)}
        for changeset in chunk:
            yield changeset, by_changeset.get(changeset.id, [])
            bar.update(1)
        after = chunk[-1].seq


class Command(BaseCommand):
    help = "Verify the changeset log's hash chain; exit 1 at the first break."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-progress", action="store_true")
        parser.add_argument(
            "--v1-anchor",
            action="append",
            default=[],
            metavar="SEQ:HASH",
            help="a v1 log head anchored before the re-chain; checked against the log",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        head = LogHead.objects.filter(pk=1).first()
        stats = chain.Stats()
        cut = ArchiveCut.objects.filter(state__in=ACTIVE_STATES).order_by("-seq").first()
        start = self._checkpoint_start(cut)
        with tqdm(
            total=(head.seq - start.seq + 1) if head else None,
            unit="changeset",
            disable=options["no_progress"],
            file=self.stderr,
        ) as bar:
            checked, broken = chain.verify(
                _pairs(bar, after=start.seq - 1), head=head, stats=stats, start=start
            )
        if broken is not None:
            self._fail(
                f"BROKEN at seq {broken.seq}"
                + (f" (changeset {broken.changeset_id})" if broken.changeset_id else "")
                + f": {broken.reason}; {checked} changeset(s) before it verified"
            )
        problems = [
            *_erasure_problems(stats),
            *_v1_problems(stats, options["v1_anchor"], cut.seq if cut else 0),
        ]
        if problems:
            self._fail("BROKEN: " + "; ".join(problems))
        if cut is not None:
            self.stdout.write(
                f"checkpoint: seq {cut.seq} hash {cut.hash} signature ok, state at the cut ok;"
                " the log before it is archived (verify it with verify_archive)"
            )
        self.stdout.write(
            f"ok: {checked} changeset(s) verified; head seq {head.seq if head else 0}"
            f" hash {(head.hash if head else None) or chain.GENESIS};"
            f" {stats.erased_images} image(s)"
            f" with {stats.erased_members} erased member(s)"
        )
        if stats.v1_head is not None:
            self.stdout.write(
                f"v1: {stats.v1_recomputed} changeset(s) recomputed, {stats.v1_committed}"
                f" held by the v2 chain (erased since); v1 head seq {stats.v1_head[0]}"
                f" hash {stats.v1_head[1]}"
            )
        for anchor in options["v1_anchor"]:
            seq = anchor.split(":")[0]
            archived = cut is not None and seq.isdigit() and int(seq) <= cut.seq
            self.stdout.write(f"v1 anchor seq {seq} " + ("archived" if archived else "ok"))

    def _checkpoint_start(self, cut: ArchiveCut | None) -> chain.Start:
        """Where the walk starts: the genesis, or the newest checkpoint once it checks out."""
        if cut is None:
            return chain.Start()
        if not checkpoint.verify_stored(cut) or (cut.checkpoint or {}).get("hash") != cut.hash:
            self._fail(f"BROKEN: the checkpoint at seq {cut.seq} does not verify (its signature)")
        if base.digest_at(cut.seq) != cut.state_digest:
            self._fail(f"BROKEN: the state at the cut (seq {cut.seq}) is not the one signed")
        return chain.Start(seq=cut.seq + 1, hash=cut.hash, v1_hash=cut.v1_hash or None)

    def _fail(self, message: str) -> None:
        self.stderr.write(message)
        raise SystemExit(1)


def _erasure_problems(stats: chain.Stats) -> list[str]:
    """The erasures' chain, and every erased member reached by a recorded erasure."""
    problems, prev, covered = [], chain.GENESIS, set()
    for erasure in Erasure.objects.order_by("id").iterator(chunk_size=CHUNK):
        if erasure.prev_hash != prev or chain.erasure_hash(prev_hash=prev, erasure=erasure) != (
            erasure.hash
        ):
            problems.append(f"erasure {erasure.id} does not chain (edited, forged or removed)")
            break
        prev = erasure.hash
        covered |= chain.erasure_covers(erasure.targets)
    stray = sorted(stats.erased - covered)
    if stray:
        problems.append(f"{len(stray)} erased member(s) without a recorded erasure: {stray[:3]}")
    return problems


def _v1_problems(stats: chain.Stats, anchors: list[str], archived: int) -> list[str]:
    """The recorded cut is the v1 prefix's head, and each anchor names a v1 hash in it
    (what lies at or before the archive cut ``archived`` is verify_archive's to check)."""
    problems = []
    upgrade = ChainUpgrade.objects.order_by("-id").first()
    if (
        upgrade is not None
        and upgrade.seq > archived
        and stats.v1_head != (upgrade.seq, upgrade.v1_hash)
    ):
        problems.append(f"the v1 head recorded at the re-chain (seq {upgrade.seq}) does not match")
    for anchor in anchors:
        seq, _, value = anchor.partition(":")
        if seq.isdigit() and int(seq) <= archived:
            continue
        row = Changeset.objects.filter(seq=int(seq) if seq.isdigit() else -1).first()
        if row is None or not row.v1_hash or row.v1_hash != value.strip():
            problems.append(f"v1 anchor {anchor} does not match the log")
    return problems
