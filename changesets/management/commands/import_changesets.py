"""Import NDJSON changeset files, each as one new changeset (rpc ImportChangeset).

    manage.py import_changesets FILE_OR_DIR ... [--dry-run] [--user NAME]

Directories are read in name order (``export_changesets`` names files by
seq). Every file is parsed strictly before anything is written; then files
apply one by one, each all-or-nothing. The first refusal stops the run with
a non-zero exit, naming the file; files before it stay applied (each is its
own changeset, so the log says exactly what landed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from atlas.exceptions import AtlasError
from changesets import ndjson
from changesets.principals import system_user
from changesets.services.interchange import changeset_import
from entities.store import baseline


def _files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(sorted(p for p in path.iterdir() if p.suffix == ".ndjson"))
        elif path.is_file():
            found.append(path)
        else:
            raise CommandError(f"no such file or directory: {raw}")
    return found


class Command(BaseCommand):
    help = "Apply NDJSON changeset files, each as one new changeset."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+", help="files or directories of .ndjson files")
        parser.add_argument(
            "--dry-run", action="store_true", help="check everything, write nothing"
        )
        parser.add_argument(
            "--user",
            default=None,
            help="author (roles apply); default: the atlas-system principal (no role checks)",
        )
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        files = _files(options["paths"])
        if not files:
            raise CommandError("no .ndjson files found")
        documents = []
        for path in files:
            try:
                documents.append((path, ndjson.parse(path.read_bytes())))
            except AtlasError as exc:
                raise CommandError(f"{path}: {exc.detail}") from exc
        actor: User | None
        if options["user"]:
            actor = get_user_model().objects.filter(username=options["user"]).first()
            if actor is None:
                raise CommandError(f"no such user: {options['user']}")
            check_permissions = True
        else:
            actor, check_permissions = system_user(), False
        store = baseline  # stage on a branch through the API (X-Atlas-Branch)
        changed = unchanged = 0
        with tqdm(
            total=len(documents), unit="file", disable=options["no_progress"], file=self.stderr
        ) as bar:
            for path, document in documents:
                try:
                    result = changeset_import(
                        store=store,
                        actor=actor,
                        document=document,
                        dry_run=options["dry_run"],
                        check_permissions=check_permissions,
                    )
                except AtlasError as exc:
                    detail = exc.detail
                    if exc.conflicts:
                        detail += " " + ", ".join(
                            f"{c['namespace']}/{c['kind']}/{c['slug']} ({c['reason']})"
                            for c in exc.conflicts[:10]
                        )
                    raise CommandError(
                        f"{path}: {detail} ({changed} file(s) applied before it)"
                    ) from exc
                if result.applied.revisions:
                    changed += 1
                else:
                    unchanged += 1
                bar.update(1)
        verb = "would apply" if options["dry_run"] else "applied"
        self.stdout.write(f"{verb} {changed} file(s); {unchanged} changed nothing")
