"""Finish post-commit work left behind (journal entries still ``committed``), now.

``python manage.py recover_batches`` runs each outstanding entry's hooks and
wakes its subscriptions' pumps, as the beat sweep would, but for every entry
whatever its age, with a progress bar. ``--report-only`` lists them and
changes nothing.

Safe to run while workers and the sweep run, and twice at once: entries are
claimed with ``SKIP LOCKED``, so an entry another runner holds is skipped
(and waited for at the end), never published twice.

Exit status: 0 when nothing is left outstanding (or with ``--report-only``),
1 when some entry could not be finished (its hooks failed, the broker was
unreachable, or another runner still held it after ``--wait``).
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from tqdm import tqdm

from changesets.outbox import journal


def _age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Command(BaseCommand):
    help = "Finish outstanding journal entries (post-commit work) now; --report-only lists them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--report-only",
            action="store_true",
            help="List outstanding entries (id, seq, age, attempts, last error); change nothing.",
        )
        parser.add_argument(
            "--older-than",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="Only entries older than this (default: all).",
        )
        parser.add_argument(
            "--limit", type=int, default=None, help="At most this many entries (oldest first)."
        )
        parser.add_argument(
            "--wait",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="How long to wait for entries another runner holds (default 30).",
        )
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args: Any, **options: Any) -> None:
        older = timedelta(seconds=options["older_than"]) if options["older_than"] > 0 else None
        qs = journal.outstanding(older_than=older).select_related("changeset")
        if options["limit"] is not None:
            qs = qs[: options["limit"]]
        if options["report_only"]:
            self._report(list(qs))
            return
        ids = [entry.pk for entry in qs]
        if not ids:
            self.stdout.write("Nothing outstanding.")
            return
        counts = {"published": 0, "already": 0, "missing": 0}
        failed: list[Any] = []
        busy: list[Any] = []
        progress = tqdm(
            total=len(ids),
            desc="journal entries",
            unit="entry",
            file=sys.stderr,
            disable=options["no_progress"],
        )
        for start in range(0, len(ids), journal.SWEEP_CHUNK):
            chunk = ids[start : start + journal.SWEEP_CHUNK]
            for changeset_id, outcome in journal.publish(chunk).items():
                self._tally(outcome, changeset_id, counts, failed, busy)
            progress.update(len(chunk))
        progress.close()

        deadline = time.monotonic() + options["wait"]
        while busy and time.monotonic() < deadline:
            time.sleep(0.2)
            waiting, busy = busy, []
            for changeset_id, outcome in journal.publish(waiting).items():
                self._tally(outcome, changeset_id, counts, failed, busy)

        self.stdout.write(
            f"Published {counts['published']}; already published by another runner "
            f"{counts['already']}; failed {len(failed)}; still held elsewhere {len(busy)}."
        )
        if failed or busy:
            left = journal.outstanding().filter(pk__in=[*failed, *busy]).select_related("changeset")
            self._report(list(left))
            n = len(failed) + len(busy)
            raise CommandError(
                f"{n} journal entr{'y' if n == 1 else 'ies'} could not be finished (see above)."
            )

    @staticmethod
    def _tally(
        outcome: str,
        changeset_id: Any,
        counts: dict[str, int],
        failed: list[Any],
        busy: list[Any],
    ) -> None:
        if outcome == journal.PUBLISHED:
            counts["published"] += 1
        elif outcome == journal.ALREADY_PUBLISHED:
            counts["already"] += 1
        elif outcome == journal.MISSING:
            counts["missing"] += 1
        elif outcome == journal.BUSY:
            busy.append(changeset_id)
        else:
            failed.append(changeset_id)

    def _report(self, entries: list[Any]) -> None:
        now = timezone.now()
        self.stdout.write(
            f"{len(entries)} outstanding journal entr{'y' if len(entries) == 1 else 'ies'}"
        )
        if not entries:
            return
        self.stdout.write(
            f"{'changeset_id':36}  {'seq':>8}  {'age':>8}  {'attempts':>8}  last_error"
        )
        for entry in entries:
            error = entry.last_error.replace("\n", " ")[:200]
            self.stdout.write(
                f"{entry.changeset_id!s:36}  {entry.changeset.seq:>8}  "
                f"{_age((now - entry.created_at).total_seconds()):>8}  {entry.attempts:>8}  {error}"
            )
