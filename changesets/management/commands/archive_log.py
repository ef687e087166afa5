"""Move the log before a cut into signed archive segments, then out of the hot tables.

    manage.py archive_log --before SEQ|RFC3339 [--dry-run] [--no-progress]
    manage.py archive_log            # finish an interrupted cut or erasure rewrite only

``--before 1000`` archives changesets 1..999; ``--before 2025-01-01T00:00:00Z``
those written before that time. The cut is pulled back so that open
branches, active subscriptions and unpublished journal entries keep what
they need (the output says which limit applied). ``--dry-run`` shows the
cut and its segments and changes nothing.

Resumable: after a crash at any step, run it again (with or without
``--before``) and it finishes the open cut first (``changesets.archive.
archiver``). Needs ``ATLAS_ARCHIVE_SIGNING_KEY`` (``manage.py archive_keygen``).
Exit status 0 when done, 1 when a cut could not go on (the message says why).
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from atlas.api.render import parse_rfc3339
from changesets.archive import archiver, locks, storage
from changesets.archive.plan import Plan

PAUSE_POINTS = (
    "planned",
    "segment-written",
    "written",
    "verified",
    "signed",
    "switched",
    "partition-detached",
    "partition-dropped",
    "removal-batch",
    "removed",
)


def parse_before(raw: str) -> int | datetime:
    if raw.isdigit():
        return int(raw)
    at = parse_rfc3339(raw)
    if at is None:
        raise CommandError(f"--before takes a seq or an RFC 3339 time, not {raw!r}")
    return at


class Command(BaseCommand):
    help = "Archive the log before a seq or a time into signed segments; resumable."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--before", help="archive changesets before this seq or time")
        parser.add_argument("--dry-run", action="store_true", help="show the cut, change nothing")
        parser.add_argument("--no-progress", action="store_true")
        parser.add_argument(
            "--pause-at",
            choices=PAUSE_POINTS,
            help="stop (sleep) at this point and wait to be killed: for crash drills and tests",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        before = parse_before(options["before"]) if options["before"] else None
        if before is None and options["dry_run"]:
            raise CommandError("--dry-run needs --before")
        try:
            if not options["dry_run"]:
                storage.signing_key()
            outcome = archiver.archive(
                before=before,
                requested_by="archive_log",
                dry_run=options["dry_run"],
                progress=self._bars(options["no_progress"]),
                pause=self._pause(options["pause_at"]),
            )
        except (archiver.ArchiveFailed, locks.Busy, storage.NotConfigured) as exc:
            self.stderr.write(f"archive_log: {exc}")
            raise SystemExit(1) from exc
        if outcome.rewrites:
            self.stdout.write(f"finished {outcome.rewrites} erasure rewrite(s) of the archive")
        for cut in outcome.cuts:
            self.stdout.write(
                f"cut through seq {cut.seq}: {cut.changesets} changeset(s), {cut.revisions}"
                f" revision(s) in {cut.segments.count()} segment(s) at {cut.location};"
                f" checkpoint hash {cut.hash}"
            )
        if outcome.plan is not None:
            self._report(outcome.plan, dry_run=outcome.dry_run)

    def _report(self, plan: Plan, *, dry_run: bool) -> None:
        for why in plan.limits:
            self.stdout.write(f"limited: {why}")
        if plan.empty:
            self.stdout.write(
                f"nothing to archive (the log is archived through seq {plan.previous})"
            )
        elif dry_run:
            self.stdout.write(
                f"would archive seqs {plan.previous + 1}..{plan.seq}: {plan.changesets}"
                f" changeset(s), {plan.revisions} revision(s) in {len(plan.segments)} segment(s)"
            )

    def _bars(self, disabled: bool) -> archiver.Progress:
        def bar(total: int, unit: str, desc: str) -> Any:
            return tqdm(total=total, unit=unit, desc=desc, disable=disabled, file=self.stderr)

        return bar

    def _pause(self, at: str | None) -> archiver.Pause:
        def pause(point: str) -> None:
            if point == at:
                sys.stderr.write(f"PAUSED {point}\n")
                sys.stderr.flush()
                while True:  # until killed: the drill kills the process here
                    time.sleep(60)

        return pause
