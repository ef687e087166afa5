"""Where a request's time goes: its statements timed by the client, and their plans.

Django's query log (``CaptureQueriesContext``) keeps each statement's time
rounded to the millisecond, so a page of five 0.3 ms statements reads as
"0 ms of SQL" or "1 ms", whichever way the rounding falls. :class:`SqlTimer`
is an execute wrapper (``connection.execute_wrapper``) instead: it times each
statement with ``perf_counter`` around the driver call (the round trip:
parse, plan, execute and fetching the rows into the client), and keeps the
statement with its parameters, so the slowest one can be re-run under
``EXPLAIN (ANALYZE, BUFFERS)`` exactly as it ran. It sees every statement of
the connection, the prepared cursors of ``atlas.db`` included (they go
through Django's wrappers too).

:func:`buffer_counts` reads the session's own buffer counters
(``pg_stat_database`` is per database; these are this backend's), so a
benchmark can say whether a timed request found its pages in PostgreSQL's
shared buffers ("hit") or had to ask the operating system for them ("read":
the OS page cache, or the disk).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Statement:
    sql: str
    params: Any
    ms: float


@dataclass
class SqlTimer:
    """The statements run while installed, each with its client-side time."""

    statements: list[Statement] = field(default_factory=list)

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = (time.perf_counter() - started) * 1000
            self.statements.append(Statement(sql, None if many else params, took))

    @property
    def ms(self) -> float:
        return sum(s.ms for s in self.statements)

    def slowest(self) -> Statement | None:
        return max(self.statements, key=lambda s: s.ms, default=None)


@contextmanager
def sql_timer() -> Iterator[SqlTimer]:
    """Time every statement of the default connection inside the block."""
    from django.db import connection

    timer = SqlTimer()
    with connection.execute_wrapper(timer):
        yield timer


@contextmanager
def prepared(cursor: Any, name: str, sql: str, params: Any) -> Iterator[tuple[str, list[Any]]]:
    """``sql`` (Django's ``%s`` placeholders) prepared as ``name`` on ``cursor``'s session,
    as ``atlas.db.prepared_cursor`` runs it: yields ``EXECUTE name(%s, …)`` and its
    parameters, to run (under ``EXPLAIN``) as often as needed; deallocated on leaving.
    Which plan it gets is the session's ``plan_cache_mode``: the caller sets it."""
    params = list(params or ())
    numbered = iter(range(1, len(params) + 1))
    text = re.sub(r"%s", lambda _m: f"${next(numbered)}", sql).replace("%%", "%")
    cursor.execute(f"PREPARE {name} AS {text}")
    try:
        yield f"EXECUTE {name}({', '.join(['%s'] * len(params))})", params
    finally:
        cursor.execute(f"DEALLOCATE {name}")


def explain(statement: Statement | None, *, io_timing: bool = True) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of a captured statement with its own parameters
    (``track_io_timing`` on for it, so reads outside shared buffers show their time).

    Only SELECTs (and WITH … SELECT) are re-run: a write would write twice.
    """
    from django.db import connection

    if statement is None:
        return ""
    sql = statement.sql
    if not _is_select(sql):
        return f"(a write, not re-run)\n{sql}"
    try:
        with connection.cursor() as cursor:
            if io_timing:
                cursor.execute("SET track_io_timing = on")
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, statement.params)
            plan = "\n".join(r[0] for r in cursor.fetchall())
            if io_timing:
                cursor.execute("RESET track_io_timing")
    except Exception as exc:  # noqa: BLE001 - a plan that cannot be re-run is reported
        plan = f"(not re-run: {type(exc).__name__}: {exc})\n{sql}"
    return plan


def execution_ms(plan: str) -> float:
    """The ``Execution Time`` an EXPLAIN ANALYZE reports (0 if none)."""
    for line in reversed(plan.splitlines()):
        if line.startswith("Execution Time:"):
            return float(line.split()[2])
    return 0.0


def slowest_plan(statements: list[Statement], *, at_most: int = 40) -> tuple[Statement | None, str]:
    """The statement whose re-run under EXPLAIN ANALYZE takes longest, and its plan.

    One request's client-side times are one sample each (a statement that met a
    scheduler hiccup looks slowest); the plans' own execution times, each statement
    re-run once, pick the statement that is slow by its plan. Up to ``at_most``
    SELECTs (a walk of many pages repeats the same few shapes).
    """
    best: tuple[float, Statement | None, str] = (-1.0, None, "")
    for statement in [s for s in statements if _is_select(s.sql)][:at_most]:
        plan = explain(statement)
        took = execution_ms(plan)
        if took > best[0]:
            best = (took, statement, plan)
    return best[1], best[2]


def _is_select(sql: str) -> bool:
    return sql.lstrip().upper().startswith(("SELECT", "WITH"))


def buffer_counts() -> tuple[int, int]:
    """(shared buffer hits, blocks read from outside shared buffers) of the whole
    database so far, as the statistics system last flushed them.

    ``pg_stat_force_next_flush()`` makes this backend's own pending counts visible
    at its next transaction end; the snapshot is cleared first so two calls in one
    session do not see the same cached numbers.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT blks_hit, blks_read FROM pg_stat_database WHERE datname = current_database()"
        )
        hit, read = cursor.fetchone()
    return int(hit), int(read)
