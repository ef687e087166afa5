"""Recompute the changeset log's hash chain and report the first break.

    manage.py verify_log [--no-progress]

Exits 0 when every changeset and revision is as written, 1 at the first
changeset whose rows no longer match (edited, removed, or reordered).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from tqdm import tqdm

from changesets import chain
from changesets.models import Changeset, LogHead, Revision

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

    def handle(self, *args: Any, **options: Any) -> None:
        head = LogHead.objects.filter(pk=1).first()
        with tqdm(
            total=head.seq if head else None,
            unit="changeset",
            disable=options["no_progress"],
            file=self.stderr,
        ) as bar:
            checked, broken = chain.verify(_pairs(bar), head=head)
        if broken is None:
            self.stdout.write(
                f"ok: {checked} changeset(s) verified; head seq {head.seq if head else 0}"
                f" hash {head.hash if head else chain.GENESIS}"
            )
            return
        self.stderr.write(
            f"BROKEN at seq {broken.seq}"
            + (f" (changeset {broken.changeset_id})" if broken.changeset_id else "")
            + f": {broken.reason}; {checked} changeset(s) before it verified"
        )
        raise SystemExit(1)
