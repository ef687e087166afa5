"""The journal relay behind a backlog: its wake query and how fast it catches up.

    .venv/bin/python bench/relay_backlog.py [--backlog 100000] [--repeat 200]

Seeds ``--backlog`` outstanding journal entries (committed changesets whose
post-commit work is owed, as after a worker outage) with set-based SQL through
Atlas's own schema, then:

1. times the relay's wake query (``changesets.outbox.relay.NEXT_BATCH``: the
   next 200 outstanding entries after the mark) with the mark at the front,
   the middle and the end of the backlog, and records its EXPLAIN;
2. drains the whole backlog with the relay's own loop
   (``JournalRelay.relay_pending``: read the next batch, publish it in one
   statement), with no hooks and with one subscription the changesets concern
   (its pump wakes are recorded, not sent), and reports entries published per
   second and the relay's CPU per entry.

Issue 15's targets: the wake query ≤ 1 ms at 100,000 outstanding, whatever the
backlog, and a relay that catches up faster than writes arrive (compare the
drain rate with the HTTP benchmark's PUT/s).
"""

from __future__ import annotations

import argparse
import time

from _common import header, summary, table
from _setup import setup, write_section

NS = "bench.relay"
SECTION = "Journal relay behind a backlog (wake query, catch-up rate)"


def seed(cursor, n: int) -> None:
    """``n`` committed changesets in ``NS`` with outstanding journal entries."""
    cursor.execute("SELECT seq FROM changesets_loghead WHERE id = 1 FOR UPDATE")
    first = cursor.fetchone()[0] + 1
    last = first + n - 1
    cursor.execute(
        "INSERT INTO changesets_changeset (id, seq, author_name, at, message, comment, branch,"
        " rpc, op_count, namespaces, prev_hash, hash)"
        " SELECT gen_random_uuid(), s, 'bench', now(), '', '', '', 'PutEntity', 1,"
        " ARRAY[%s]::varchar[], NULL, NULL FROM generate_series(%s, %s) AS s",
        [NS, first, last],
    )
    cursor.execute(
        "INSERT INTO changesets_journalentry (changeset_id, seq, phase, created_at, attempts,"
        " last_error, failures)"
        " SELECT id, seq, 'committed', at, 0, '', 0 FROM changesets_changeset"
        " WHERE seq BETWEEN %s AND %s",
        [first, last],
    )
    # The head moves past the seeded seqs, so later real writes follow them.
    cursor.execute("UPDATE changesets_loghead SET seq = %s WHERE id = 1", [last])
    cursor.execute("ANALYZE changesets_journalentry")


def time_wake(cursor, marks: dict[str, int], repeat: int) -> tuple[list[list], str]:
    from changesets.outbox.relay import BATCH, NEXT_BATCH

    rows = []
    for name, mark in marks.items():
        samples = []
        for _ in range(repeat):
            started = time.perf_counter()
            cursor.execute(NEXT_BATCH, [mark, BATCH])
            found = cursor.fetchall()
            samples.append((time.perf_counter() - started) * 1000)
        s = summary(samples)
        rows.append([name, s["p50"], s["p95"], len(found)])
    cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + NEXT_BATCH, [marks["middle"], BATCH])
    plan = "\n".join(r[0] for r in cursor.fetchall())
    return rows, plan


def drain(label: str, backlog: int) -> list:
    """Run the relay's loop until nothing is outstanding; rate and CPU per entry."""
    from django.db import connection

    from changesets.outbox import pumps
    from changesets.outbox.relay import JournalRelay

    woken: list[str] = []
    real = pumps.enqueue_pump
    pumps.enqueue_pump = lambda sid, countdown=None: woken.append(sid)
    try:
        relay = JournalRelay(poll_seconds=60, linger_seconds=0)
        relay.wakes.interval = 0.1
        connection.ensure_connection()
        raw = connection.connection
        wall, cpu = time.perf_counter(), time.process_time()
        while relay.relay_pending(raw):
            relay.wakes.flush()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        pumps.enqueue_pump = real
    done = relay.published_total
    assert done == backlog, f"published {done} of {backlog}"
    return [label, done, wall, done / wall, cpu * 1e6 / done, len(woken)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    setup(database="atlas_bench_relay")

    from django.db import connection, transaction

    from changesets.outbox.subscriptions import subscription_create
    from entities.models import Namespace

    Namespace.objects.get_or_create(name=NS)
    drains = []
    wake_rows: list[list] = []
    plan = ""
    for label in ("no subscriptions, no hooks", "one subscription"):
        with transaction.atomic(), connection.cursor() as cursor:
            # The seeded seqs follow the log head (published entries are deleted, so
            # the journal itself no longer says where the last run ended).
            cursor.execute("SELECT COALESCE(max(seq), 0) FROM changesets_changeset")
            before = cursor.fetchone()[0]
            seed(cursor, args.backlog)
        if label == "one subscription":
            from django.test.utils import override_settings

            with override_settings(ATLAS_ALLOW_PRIVATE_WEBHOOKS=True):
                subscription_create(
                    actor=None, name="bench", url="http://127.0.0.1:9/", start="now"
                )
        if not wake_rows:
            with connection.cursor() as cursor:
                first = before
                marks = {
                    "front of the backlog": first,
                    "middle": first + args.backlog // 2,
                    "last 100": first + args.backlog - 100,
                }
                wake_rows, plan = time_wake(cursor, marks, args.repeat)
        print(f"draining {args.backlog:,} outstanding entries ({label}) ...", flush=True)
        drains.append(drain(label, args.backlog))
        print(f"  {drains[-1][3]:,.0f} entries/s, {drains[-1][4]:.0f} µs CPU each", flush=True)

    for row in wake_rows:
        print(f"wake query, mark at {row[0]}: p50 {row[1]:.3f} ms, p95 {row[2]:.3f} ms")
    body = "\n".join(
        [
            header(".venv/bin/python bench/relay_backlog.py" + f" --backlog {args.backlog}"),
            "",
            f"{args.backlog:,} outstanding journal entries seeded by SQL; the wake query"
            f" (`relay.NEXT_BATCH`, 200 rows after the mark) timed {args.repeat} times at"
            " each mark, then the backlog drained by the relay's own loop (batches of 200,"
            " each one claim-and-delete statement; pump wakes recorded, not sent).",
            "",
            table(["mark", "wake query p50 ms", "p95 ms", "rows"], wake_rows),
            "",
            table(
                ["drain", "entries", "seconds", "entries/s", "relay CPU µs/entry", "pump wakes"],
                drains,
            ),
            "",
            "EXPLAIN (ANALYZE, BUFFERS) of the wake query, mark in the middle:",
            "",
            "```",
            plan,
            "```",
        ]
    )
    write_section(SECTION, body)


if __name__ == "__main__":
    main()
