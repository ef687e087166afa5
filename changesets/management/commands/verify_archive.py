"""Verify an archive offline: its checkpoints' signatures, the segments, the chain.

    manage.py verify_archive [LOCATION] [--public-key KEY ...] [--no-progress]

``LOCATION`` is a folder holding ``checkpoints/`` and ``segments/`` (a copy of
the archive); without it, the configured ``STORAGES["atlas_archive"]``. Needs
no database: nothing here connects to one (``changesets.archive.offline``
says what is checked; ``python -m changesets.archive.offline`` is the same
without Django). ``--public-key`` (repeatable, base64 or PEM) is the key you
trust; without it the key in the checkpoint files is used, which only shows
the files agree with each other.

Exit status 0 when everything verifies, 1 at the first problem.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from tqdm import tqdm

from changesets.archive import offline, signing
from changesets.archive.storage import StorageSource


class Command(BaseCommand):
    help = "Verify archive segments and checkpoints offline (no database needed)."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("location", nargs="?", help="a folder (default: the archive storage)")
        parser.add_argument("--public-key", action="append", default=[], metavar="KEY")
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        source: offline.Source = (
            offline.DirectorySource(options["location"]) if options["location"] else StorageSource()
        )
        with tqdm(unit="changeset", disable=options["no_progress"], file=self.stderr) as bar:
            try:
                report = offline.verify_archive(
                    source, public_keys=options["public_key"], progress=bar.update
                )
            except signing.BadKey as exc:
                self.stderr.write(f"verify_archive: --public-key: {exc}")
                raise SystemExit(1) from exc
        if not report.ok:
            self.stderr.write(offline.summary(report))
            raise SystemExit(1)
        self.stdout.write(offline.summary(report))
