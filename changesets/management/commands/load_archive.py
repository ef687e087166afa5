"""Load archived segments back into PostgreSQL, verified, in a schema of their own.

    manage.py load_archive SEGMENT ... [--schema NAME] [--from DIR] [--public-key KEY ...]
    manage.py load_archive --all [--schema NAME] ...

``SEGMENT`` is a segment's name as its checkpoint lists it
(``segments/000000000001-000000000400.ndjson.gz``), read from the archive
storage or, with ``--from``, from a folder holding a copy of the archive.
Each is verified on the way in (its checkpoint's signature, its SHA-256, the
chain across it) and loaded into ``<schema>.changeset`` and
``<schema>.revision`` (default schema ``atlas_archive``), never into the live
tables (``changesets.archive.load`` says why). Loading twice changes nothing.
Drop it when done: ``DROP SCHEMA atlas_archive CASCADE``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from changesets.archive import load, offline, signing, storage


class Command(BaseCommand):
    help = "Verify archive segments and load them into a separate schema for investigation."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("segments", nargs="*", help="segment names, as checkpoints list them")
        parser.add_argument("--all", action="store_true", help="every segment of the archive")
        parser.add_argument("--schema", default=load.DEFAULT_SCHEMA)
        parser.add_argument("--from", dest="folder", help="a folder holding a copy of the archive")
        parser.add_argument("--public-key", action="append", default=[], metavar="KEY")

    def handle(self, *args: Any, **options: Any) -> None:
        source: offline.Source = (
            offline.DirectorySource(options["folder"])
            if options["folder"]
            else storage.StorageSource()
        )
        names = list(options["segments"])
        if options["all"]:
            names += [
                s["name"] for c in offline.load_checkpoints(source) for s in c.get("segments", [])
            ]
        if not names:
            raise CommandError("name at least one segment, or --all")
        keys = self._keys(options["public_key"])
        changesets = revisions = 0
        for name in names:
            try:
                loaded = load.load_segment(source, name, schema=options["schema"], public_keys=keys)
            except (load.LoadFailed, OSError) as exc:
                raise CommandError(f"{name}: {exc}") from exc
            changesets += loaded.changesets
            revisions += loaded.revisions
            self.stdout.write(f"{name}: verified, {loaded.changesets} changeset(s) loaded")
        self.stdout.write(
            f"loaded {changesets} changeset(s) and {revisions} revision(s) into schema"
            f" {options['schema']} (tables changeset, revision)"
        )

    def _keys(self, given: list[str]) -> list[Any]:
        """The trusted keys: those given, else the configured signing key's public half."""
        texts = given or [k for k in [storage.public_key()] if k]
        if not texts:
            raise CommandError(
                "no key to verify against: pass --public-key or set ATLAS_ARCHIVE_SIGNING_KEY"
            )
        try:
            return [signing.load_public_key(t) for t in texts]
        except signing.BadKey as exc:
            raise CommandError(f"--public-key: {exc}") from exc
