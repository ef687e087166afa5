"""Export changesets as NDJSON files, one file per changeset.

    manage.py export_changesets --out DIR [--from-seq N] [--to-seq M] [--branch NAME] [ID ...]

Files are named ``<seq>-<id>.ndjson`` so that a directory sorts in commit
order, which is the order ``import_changesets`` applies them in.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from changesets import ndjson
from changesets.models import BASELINE, Changeset
from changesets.selectors.log import revisions_of


class Command(BaseCommand):
    help = "Export changesets (by id or seq range) as NDJSON files, one per changeset."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="*", help="changeset ids (default: the seq range)")
        parser.add_argument("--out", required=True, help="directory to write the files into")
        parser.add_argument("--from-seq", type=int, default=1)
        parser.add_argument("--to-seq", type=int, default=None)
        parser.add_argument(
            "--branch", default=BASELINE, help='branch to export (default: baseline "")'
        )
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"])
        out.mkdir(parents=True, exist_ok=True)
        if options["ids"]:
            try:
                ids = [uuid.UUID(i) for i in options["ids"]]
            except ValueError as exc:
                raise CommandError(f"not a changeset id: {exc}") from exc
            qs = Changeset.objects.filter(pk__in=ids)
            missing = set(ids) - set(qs.values_list("id", flat=True))
            if missing:
                raise CommandError(f"no such changeset(s): {', '.join(map(str, missing))}")
        else:
            qs = Changeset.objects.filter(branch=options["branch"], seq__gte=options["from_seq"])
            if options["to_seq"] is not None:
                qs = qs.filter(seq__lte=options["to_seq"])
        qs = qs.order_by("seq")
        total = qs.count()
        written = 0
        with tqdm(
            total=total, unit="changeset", disable=options["no_progress"], file=self.stderr
        ) as bar:
            for changeset in qs.iterator(chunk_size=200):
                revisions = list(revisions_of(changeset).order_by("id"))
                path = out / f"{changeset.seq:012d}-{changeset.id}.ndjson"
                with path.open("w", encoding="utf-8") as handle:
                    handle.writelines(ndjson.export_lines(changeset, revisions))
                written += 1
                bar.update(1)
        self.stdout.write(f"exported {written} changeset(s) to {out}")
