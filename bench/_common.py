"""Helpers shared by the benchmarks against the peers (bench/run_all.py runs them all).

Every part script:

- takes ``--smoke`` (tiny sizes: the CI smoke test) and ``--json PATH`` (its results,
  for the driver's summary), from ``part_parser`` and ``parse_part_args``;
- writes its own ``## …`` section of docs/benchmarks.md (``ATLAS_BENCH_DOC``, or the
  script's ``--doc PATH``, redirects it) and its plot into docs/benchmarks/
  (``ATLAS_BENCH_PLOTS`` redirects them);
- bounds every loop by a count and by a deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from _setup import ROOT, doc_path

PEER_PACKAGES = ("django-simple-history", "django-reversion", "django-pghistory")
# When this process (one part of the suite) started, and the load average then.
STARTED_AT = time.strftime("%Y-%m-%d %H:%M %Z")
STARTED_LOAD = os.getloadavg()


def bench_env() -> None:
    """Production-like settings for every benchmark process (children inherit them).

    DEBUG off (no query log, no debug pages), a throw-away secret, local hosts only.
    """
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "atlas-benchmark-only-not-a-secret")
    os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
    os.environ.setdefault("ATLAS_ALLOW_PRIVATE_WEBHOOKS", "1")  # the feed's local receiver
    os.environ.setdefault("LOG_LEVEL", "WARNING")


def part_parser(
    doc: str | None,
    *,
    smoke: str | None = "tiny sizes (CI)",
    doc_option: bool = True,
    plots_option: bool = False,
) -> argparse.ArgumentParser:
    """The command line every part script starts from: ``--smoke``, ``--json``, ``--doc``.

    One place for the options bench/run_all.py, the Makefile and the CI smoke tests
    (tests/bench/smoke.py) pass to every part, so each script spells, defaults and
    explains them alike; the script adds its own options and parses with
    ``parse_part_args``. ``doc`` is the script's docstring (its first paragraph is the
    description); ``smoke`` the help of ``--smoke``, None for a script with no smoke
    size; ``doc_option`` False for a script that takes no ``--doc`` (only
    ``ATLAS_BENCH_DOC`` redirects its section); ``plots_option`` True for a script
    that draws PNGs and takes ``--plots DIR`` for them.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    if smoke is not None:
        parser.add_argument("--smoke", action="store_true", help=smoke)
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="also write the results here, as JSON"
    )
    if doc_option:
        parser.add_argument(
            "--doc",
            default=None,
            metavar="PATH",
            help="write the section here, not docs/benchmarks.md (ATLAS_BENCH_DOC)",
        )
    if plots_option:
        parser.add_argument(
            "--plots",
            default=None,
            metavar="DIR",
            help="write the PNGs here, not docs/benchmarks (ATLAS_BENCH_PLOTS)",
        )
    return parser


def parse_part_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """``parser``'s arguments; with ``--doc PATH`` (``--plots DIR``), ``ATLAS_BENCH_DOC``
    (``ATLAS_BENCH_PLOTS``) set to it made absolute, for this process and the children
    it starts (a relative path would name another file in a child that runs
    elsewhere, or after a chdir)."""
    args = parser.parse_args(argv)
    if getattr(args, "doc", None):
        os.environ["ATLAS_BENCH_DOC"] = os.path.abspath(args.doc)
    if getattr(args, "plots", None):
        os.environ["ATLAS_BENCH_PLOTS"] = os.path.abspath(args.plots)
    return args


def database(smoke: bool) -> str:
    """The benchmark database: a separate one for smoke runs, so tiny populations
    (reused by later runs) never end up in the one the full run measures."""
    explicit = os.environ.get("ATLAS_BENCH_DB")
    if explicit:
        return explicit
    return "atlas_bench_smoke" if smoke else "atlas_bench"


def plots_dir() -> Path:
    path = Path(os.environ.get("ATLAS_BENCH_PLOTS") or ROOT / "docs" / "benchmarks")
    path.mkdir(parents=True, exist_ok=True)
    return path


def pct(samples: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; NaN for no samples."""
    data = sorted(samples)
    if not data:
        return float("nan")
    rank = max(1, min(len(data), round(q / 100 * len(data) + 0.5)))
    return data[rank - 1]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50": statistics.median(samples) if samples else float("nan"),
        "p95": pct(samples, 95),
        "p99": pct(samples, 99),
        "mean": statistics.fmean(samples) if samples else float("nan"),
        "min": min(samples) if samples else float("nan"),
        "max": max(samples) if samples else float("nan"),
    }


def timed_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``fn``'s wall time in ms, and what it returned.

    (Atlas's post-commit work runs in the workers' journal relay, never in the
    caller's process, so nothing of it lands on the next sample.)
    """
    start = time.perf_counter()
    value = fn()
    elapsed = (time.perf_counter() - start) * 1000
    return elapsed, value


def repeat_ms(fn: Callable[[], Any], count: int, *, seconds: float, warm: int = 1) -> list[float]:
    """Run ``fn`` ``warm`` times untimed, then up to ``count`` timed runs within ``seconds``."""
    for _ in range(warm):
        fn()
    deadline = time.monotonic() + seconds
    samples: list[float] = []
    for _ in range(count):
        samples.append(timed_ms(fn)[0])
        if time.monotonic() > deadline:
            break
    return samples


def interleaved_ms(
    fns: dict[Any, Callable[[], Any]],
    count: int,
    *,
    seconds: float | None = None,
    rotate: bool = False,
) -> dict[Any, list[float]]:
    """Each function once untimed, then up to ``count`` rounds of one timed call each.

    Interleaving (each round runs every function once) means a load spike from
    whatever else shares the machine hits every read alike, so ratios between
    them hold up better than times measured one function after another.
    ``rotate`` turns the order one step each round: for long calls of the same
    work, where going first or second in a round moved a ratio by 0.3 (the as-of
    traversals of bench/asof_time.py, 0.87× one way round, 1.30× the other).
    """
    for fn in fns.values():
        fn()
    samples: dict[Any, list[float]] = {key: [] for key in fns}
    deadline = None if seconds is None else time.monotonic() + seconds
    keys = list(fns)
    for round_ in range(count):
        turn = round_ % len(keys) if rotate else 0
        for key in keys[turn:] + keys[:turn]:
            samples[key].append(timed_ms(fns[key])[0])
        if deadline is not None and time.monotonic() > deadline:
            break
    return samples


def stop_process_group(process: subprocess.Popen, *, grace: float = 15) -> None:
    """SIGTERM the process group started with ``start_new_session``; SIGKILL it after
    ``grace`` seconds (gunicorn and celery leave workers behind otherwise)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


def clear_journal_backlog() -> None:
    """Delete every journal entry still ``committed`` (what publishing does), before a
    journal relay starts.

    Only for bench/feed_lag.py, whose commit-to-receipt lag is about its own
    writes: the other parts run no worker, so their entries pile up run after run,
    and a relay starts before the oldest outstanding entry (changesets/outbox/relay.py).
    Never for a throughput benchmark: skipping that work is what made the old HTTP
    benchmark flatter Atlas (issue 15); bench/http_throughput.py has the worker drain it.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM changesets_journalentry WHERE phase = 'committed'")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("Django", "djangorestframework", "psycopg", "gunicorn", "celery", *PEER_PACKAGES):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    return {
        "node": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def pg_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return cursor.fetchone()[0]


def peers_available() -> bool:
    from django.conf import settings

    return bool(getattr(settings, "BENCH_PEERS", False))


def header(command: str) -> str:
    """The provenance line every section starts with."""
    m = machine()
    v = versions()
    start, end = STARTED_LOAD, m["load"]
    return (
        f"Measured {STARTED_AT} on {m['node']} ({m['cores']} cores, {m['cpu']},"
        f" {m['memory_gib']} GiB); load average"
        f" (1/5/15 min) {start[0]:.2f}/{start[1]:.2f}/{start[2]:.2f} when this part started,"
        f" {end[0]:.2f}/{end[1]:.2f}/{end[2]:.2f} when it ended; Python {v['python']},"
        f" Django {v.get('Django', '?')}, PostgreSQL {pg_version()}.\n"
        f"Command: `{command}`."
    )


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=1, default=str))


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            if value != value:  # NaN
                return "–"
            return f"{value:.2f}" if abs(value) < 100 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def image(name: str, alt: str) -> str:
    """Markdown for a plot in the plots folder, relative to the doc; '' if it was not drawn."""
    path = plots_dir() / name
    if not path.exists():
        return ""
    rel = os.path.relpath(path, doc_path().parent)
    return f"![{alt}]({rel})"


def plot(
    name: str,
    series: dict[str, tuple[list[float], list[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    ymin0: bool = False,
) -> Path | None:
    """A line plot of ``{label: (xs, ys)}`` as PNG in the plots folder; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    atlas_seen = 0
    for label, (xs, ys) in series.items():
        style: dict[str, Any] = {"marker": "o"}
        if label.startswith("Atlas"):  # Atlas thick: the first in black, others dark grey
            style.update(linewidth=2.6, color="black" if atlas_seen == 0 else "dimgray")
            style["marker"] = "o" if atlas_seen == 0 else "s"
            atlas_seen += 1
        if "current" in label:  # a reference line, not a measured curve
            style.update(linestyle="--", marker=None)
        ax.plot(xs, ys, label=label, **style)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    elif ymin0:
        ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = plots_dir() / name
    fig.savefig(path)
    plt.close(fig)
    return path


def drop_secondary(cursor, table: str) -> list[str]:
    """Drop ``table``'s unique/foreign-key constraints and secondary indexes (not the
    primary key); return the statements that recreate them exactly as they were.

    Loading an empty table and then building each index once (a sort) is several
    times faster than maintaining six indexes row by row over 10M rows.
    """
    cursor.execute(
        "SELECT conname, pg_get_constraintdef(oid), contype FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype IN ('u', 'f')",
        [table],
    )
    constraints = cursor.fetchall()
    cursor.execute(
        "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x"
        " JOIN pg_class i ON i.oid = x.indexrelid"
        " WHERE x.indrelid = %s::regclass AND NOT x.indisprimary"
        " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)",
        [table],
    )
    indexes = cursor.fetchall()
    for name, _definition, _kind in constraints:
        cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    for name, _definition in indexes:
        cursor.execute(f'DROP INDEX "{name}"')
    # Unique constraints first (their indexes), foreign keys last (they validate). On a
    # partitioned table pg_get_indexdef says ``ON ONLY``, which would build the parent's
    # index alone (invalid, and no partition indexed): the load wants every partition's.
    recreate = [definition.replace(" ON ONLY ", " ON ", 1) for _name, definition in indexes]
    recreate += [
        f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}'
        for name, definition, kind in sorted(constraints, key=lambda c: c[2] == "f")
    ]
    return recreate


def drop_for_load(cursor, tables: tuple[str, ...]) -> list[str]:
    """:func:`drop_secondary` over ``tables``; the statements that recreate them, every
    foreign key last: a key may name another table's unique constraint (the revision's
    goes by the changeset's seq, migration 0031)."""
    # Each revision partition's own key to its changeset partition (migration 0038)
    # names the changeset table's unique seq: it goes first, and comes back with the keys.
    cursor.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE contype = 'f' AND conparentid = 0 AND conrelid IN"
        " (SELECT inhrelid FROM pg_inherits WHERE inhparent = ANY(%s::regclass[]))",
        [list(tables)],
    )
    keys = cursor.fetchall()
    for table, name, _definition in keys:
        cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    recreate = [statement for table in tables for statement in drop_secondary(cursor, table)]
    recreate += [f'ALTER TABLE {t} ADD CONSTRAINT "{n}" {d}' for t, n, d in keys]
    return sorted(recreate, key=lambda statement: " FOREIGN KEY " in statement)
