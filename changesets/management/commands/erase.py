"""Erase a value across a namespace: every entity that ever held it at a pointer.

    manage.py erase --namespace acme.crm --where /email=ann@example.org \
        [--kind customer] [--pointer /address ...] --reason "GDPR request 42" \
        --user alice [--dry-run] [--batch-size 100] [--no-progress]

Finds every entity of the namespace (and kind) with any revision, on any
branch, whose before or after image holds ``VALUE`` at ``POINTER`` (``VALUE``
is read as JSON when it parses, else as a string), then erases ``POINTER``
and every ``--pointer`` on them with the same service as ``POST /erase``, a
batch of entities per erasure, with a progress bar. ``--user`` is recorded as
the author and must be a maintainer of the namespace.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from tqdm import tqdm

from atlas.exceptions import AtlasError
from changesets.services.erase import EraseTarget, entities_erase, parse_pointer
from entities.store import EntityKey

# A before image holds VALUE at POINTER exactly when ``undo`` or ``after`` does: a
# member of before is either in ``undo`` or the same as after's (``changesets.undo``).
_MATCHING = (
    "SELECT DISTINCT kind, slug FROM changesets_revision"
    " WHERE namespace = %(ns)s AND (%(kind)s::text IS NULL OR kind = %(kind)s)"
    " AND (undo #> %(path)s::text[] = %(value)s::jsonb"
    "  OR after #> %(path)s::text[] = %(value)s::jsonb)"
    " ORDER BY kind, slug"
)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class Command(BaseCommand):
    help = "Erase a value at a pointer from every entity of a namespace that ever held it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--namespace", required=True)
        parser.add_argument("--kind", default=None)
        parser.add_argument("--where", required=True, metavar="POINTER=VALUE")
        parser.add_argument("--pointer", action="append", default=[], help="also erase this")
        parser.add_argument("--reason", required=True)
        parser.add_argument("--user", required=True, help="the author; a maintainer")
        parser.add_argument("--dry-run", action="store_true")
        parser.add_argument("--batch-size", type=int, default=100)
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        pointer, sep, raw = options["where"].partition("=")
        try:
            path = parse_pointer(pointer)
        except ValueError as exc:
            raise CommandError(f"--where: {exc}") from exc
        if not sep:
            raise CommandError("--where takes POINTER=VALUE")
        actor = get_user_model().objects.filter(username=options["user"]).first()
        if actor is None:
            raise CommandError(f"no such user: {options['user']}")
        with connection.cursor() as cursor:
            cursor.execute(
                _MATCHING,
                {
                    "ns": options["namespace"],
                    "kind": options["kind"],
                    "path": path,
                    "value": json.dumps(_value(raw)),
                },
            )
            keys = [EntityKey(options["namespace"], k, s) for k, s in cursor.fetchall()]
        pointers = tuple(dict.fromkeys([pointer, *options["pointer"]]))
        size, redacted = max(1, options["batch_size"]), 0
        with tqdm(
            total=len(keys), unit="entity", disable=options["no_progress"], file=self.stderr
        ) as bar:
            for start in range(0, len(keys), size):
                batch = keys[start : start + size]
                try:
                    result = entities_erase(
                        actor=actor,
                        targets=[EraseTarget(k, pointers) for k in batch],
                        reason=options["reason"],
                        dry_run=options["dry_run"],
                        context=None,
                    )
                except AtlasError as exc:
                    raise CommandError(exc.detail) from exc
                redacted += result.erasure.revisions_redacted
                bar.update(len(batch))
        self.stdout.write(
            f"{'dry run: ' if options['dry_run'] else ''}{len(keys)} entit(ies),"
            f" {redacted} revision(s) redacted"
        )
