"""Run the journal relay in the foreground (``changesets.outbox.relay``).

``python manage.py journal_relay`` listens for committed changesets and
publishes their journal entries (or, with hooks registered, enqueues them for
the Celery workers), as each worker's built-in relay does
(``ATLAS_JOURNAL_RELAY_IN_WORKER``). Run it where workers should not hold the
extra database session, or for a deployment whose workers run
with the relay turned off. Several may run: one is active at a time, the
others wait for its lock. Prints a line when it becomes active and, every
``--report-seconds``, how many entries it has relayed. Stops on Ctrl-C or
SIGTERM.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from changesets.outbox.relay import JournalRelay, start_in_thread


class Command(BaseCommand):
    help = "Run the journal relay (publish committed changesets' journal entries) until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--report-seconds",
            type=float,
            default=60.0,
            help="Print the relayed count this often (0: never). Default 60.",
        )

    def handle(self, *args: Any, report_seconds: float, **options: Any) -> None:
        relay = start_in_thread(JournalRelay())
        signal.signal(signal.SIGTERM, lambda *_: relay.stop.set())
        announced = False
        next_report = time.monotonic() + report_seconds
        try:
            while not relay.stop.wait(1.0):
                if relay.active.is_set() and not announced:
                    how = (
                        f"polling every {relay.poll_seconds:g} s"
                        if relay.mode == "poll"
                        else "listening on atlas_journal"
                    )
                    self.stdout.write(f"journal relay: active ({how})")
                    self.stdout.flush()
                    announced = True
                if report_seconds and time.monotonic() >= next_report:
                    next_report += report_seconds
                    self.stdout.write(f"journal relay: {_handled(relay)} so far")
                    self.stdout.flush()
        except KeyboardInterrupt:
            relay.stop.set()
        self.stdout.write(f"journal relay: stopped; {_handled(relay)}")


def _handled(relay: JournalRelay) -> str:
    total = relay.published_total + relay.enqueued_total
    return (
        f"{total} entr(ies) relayed ({relay.published_total} published here,"
        f" {relay.enqueued_total} enqueued for hooks)"
    )
