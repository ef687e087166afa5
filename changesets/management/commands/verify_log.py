"""Recompute the changeset log's hash chain and report the first break.

    manage.py verify_log [--no-progress] [--v1-anchor SEQ:HASH ...]

Exits 0 when every changeset and revision is as written (erased members by
the digests their erasure kept), 1 at the first changeset whose rows no longer
match (edited, removed, or reordered). Also checks the erasures' own chain,
that every erased member is reached by a recorded erasure, that the v1 hashes
of changesets from before the re-chain (migration 0018) still chain up to the
recorded cut, and each ``--v1-anchor`` (a ``seq:hash`` someone anchored from
``GET /log/head`` before the re-chain).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from tqdm import tqdm

from changesets import chain
from changesets.models import ChainUpgrade, Changeset, Erasure, LogHead, Revision

CHUNK = 500


def _pairs(bar: tqdm) -> Iterator[tuple[Changeset, list[Revision]]]:
    """(changeset, its revisions in write order), in seq order, a chunk at a time."""
    after = 0
    while True:
        chunk = list(Changeset.objects.filter(seq__gt=after).order_by("seq")[:CHUNK])
        if not chunk:
            return
        revisions = Revision.objects.filter(changeset__in=chunk).order_by("changeset_id", "id")
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
        with tqdm(
            total=head.seq if head else None,
            unit="changeset",
            disable=options["no_progress"],
            file=self.stderr,
        ) as bar:
            checked, broken = chain.verify(_pairs(bar), head=head, stats=stats)
        if broken is not None:
            self._fail(
                f"BROKEN at seq {broken.seq}"
                + (f" (changeset {broken.changeset_id})" if broken.changeset_id else "")
                + f": {broken.reason}; {checked} changeset(s) before it verified"
            )
        problems = [*_erasure_problems(stats), *_v1_problems(stats, options["v1_anchor"])]
        if problems:
            self._fail("BROKEN: " + "; ".join(problems))
        self.stdout.write(
            f"ok: {checked} changeset(s) verified; head seq {head.seq if head else 0}"
            f" hash {head.hash if head else chain.GENESIS}; {stats.erased_images} image(s)"
            f" with {stats.erased_members} erased member(s)"
        )
        if stats.v1_head is not None:
            self.stdout.write(
                f"v1: {stats.v1_recomputed} changeset(s) recomputed, {stats.v1_committed}"
                f" held by the v2 chain (erased since); v1 head seq {stats.v1_head[0]}"
                f" hash {stats.v1_head[1]}"
            )
        for anchor in options["v1_anchor"]:
            self.stdout.write(f"v1 anchor seq {anchor.split(':')[0]} ok")

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


def _v1_problems(stats: chain.Stats, anchors: list[str]) -> list[str]:
    """The recorded cut is the v1 prefix's head, and each anchor names a v1 hash in it."""
    problems = []
    upgrade = ChainUpgrade.objects.order_by("-id").first()
    if upgrade is not None and stats.v1_head != (upgrade.seq, upgrade.v1_hash):
        problems.append(f"the v1 head recorded at the re-chain (seq {upgrade.seq}) does not match")
    for anchor in anchors:
        seq, _, value = anchor.partition(":")
        row = Changeset.objects.filter(seq=int(seq) if seq.isdigit() else -1).first()
        if row is None or not row.v1_hash or row.v1_hash != value.strip():
            problems.append(f"v1 anchor {anchor} does not match the log")
    return problems
