"""bench/scale.py --report: the docs section, the plot and the plans file from saved runs.

Runs are ``docs/benchmarks/scale-<size>-<label>.json``. ``before`` is issue 18's
code; ``after`` the first measurement of the fix (in-process only, one page
after another, SQL time as Django rounds it); ``warm`` (method 2) the current
method (bench/_scale_measure.py): a warm pass, sizes interleaved, SQL timed at
the client, rendering, blocks read, and the same pages over gunicorn. The
section shows every label saved, in that order (delete a label's files to drop
its table).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from _common import plots_dir
from _setup import ROOT, write_section

# 2k and 10k: for checks (tests/bench/test_read_bench.py), not for the docs.
SIZES = {"2k": 2_000, "10k": 10_000, "100k": 100_000, "1m": 1_000_000, "10m": 10_000_000}
TARGET_MS = 100.0
FLAT = 1.3
# Blocks read from outside shared buffers that can explain a millisecond or so (from the
# OS page cache a block costs microseconds): fewer are not named as a reason.
READS_WORTH_NAMING = 50
TITLE = "Every page at 100k, 1M (and 10M) changesets (issue 18)"
Runs = dict[str, dict[int, dict[str, Any]]]


def load() -> Runs:
    runs: Runs = {}
    for path in sorted(plots_dir().glob("scale-*.json")):
        data = json.loads(path.read_text())
        label = path.stem.split("-", 2)[2]
        runs.setdefault(label, {})[data["size"]] = data
    return runs


def notes() -> str:
    text = Path(ROOT / "bench" / "scale_notes.md").read_text().rstrip() + "\n"
    times = []
    for size, n in SIZES.items():
        path = plots_dir() / f"scale-populate-{size}.txt"
        if path.exists():
            took = json.loads(path.read_text())
            times.append(f"{took['seconds']:.0f} s at {n:,} (VACUUM {took['vacuum']:.0f} s)")
    text = text.replace("POPULATE_TIMES", ", ".join(times) or "(not recorded)")
    cost = plots_dir() / "scale-write-cost.md"
    return text.replace("WRITE_COST", cost.read_text() if cost.exists() else "(not measured)")


def report() -> None:
    """The section: the notes, then ``before`` and the newest method's table."""
    runs = load()
    order = {"before": 0, "after": 1, "warm": 2}
    shown = sorted(runs, key=lambda label: (order.get(label, 3), label))
    body = [notes()]
    for label in shown:
        if label not in runs:
            continue
        sizes = sorted(runs[label])
        cells: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
        for s in sizes:
            for r in runs[label][s]["results"]:
                cells.setdefault((r["page"], r["user"]), {})[s] = r
        method2 = all(runs[label][s].get("method") == 2 for s in sizes)
        table = warm_table(cells, sizes) if method2 else plain_table(cells, sizes)
        body += [f"\n### {label}\n", *table]
    write_section(TITLE, "\n".join(body))
    # The plot is the current method's run (``warm``), else the last one shown.
    plot(runs, "warm" if "warm" in runs else shown[-1])
    plans(runs)


def _cell(v: dict[str, Any] | None, key: str = "p50", fmt: str = "{:.1f}") -> str:
    if not v or key not in v:
        return "—"
    text = fmt.format(v[key])
    over = key in ("p50", "http_p50") and (v[key] > TARGET_MS or v["status"] >= 400)
    return f"**{text}**" if over else text


def _ratio(vals: list[dict[str, Any] | None], key: str = "p50") -> float | None:
    if len(vals) < 2 or not vals[0] or not vals[-1] or key not in vals[-1]:
        return None
    return vals[-1][key] / vals[0][key]


def plain_table(cells: dict, sizes: list[int]) -> list[str]:
    """The first method's columns (``before``, ``after``)."""
    head = " | ".join(f"p50 ms at {s:,}" for s in sizes)
    sql_head = " | ".join(f"SQL ms at {s:,}" for s in sizes)
    out = [f"| page | user | {head} | ratio | {sql_head} | queries |"]
    out.append("|---|---|" + "---|" * (2 * len(sizes)) + "---|---|")
    for (page, user), by_size in cells.items():
        vals = [by_size.get(s) for s in sizes]
        ratio = _ratio(vals)
        out.append(
            f"| {page} | {user} | {' | '.join(_cell(v) for v in vals)}"
            f" | {'—' if ratio is None else f'{ratio:.2f}'}"
            f" | {' | '.join(_cell(v, 'sql_ms') for v in vals)}"
            f" | {vals[-1]['queries'] if vals[-1] else '—'} |"
        )
    return out


def _python(v: dict[str, Any] | None) -> str:
    if not v or "python_ms" not in v:
        return "—"
    render = f" ({v['render_ms']:.1f})" if "render_ms" in v else ""
    return f"{v['python_ms']:.1f}{render}"


def _short(size: int) -> str:
    """100000 → 100k, 1000000 → 1M."""
    return f"{size // 1_000_000}M" if size >= 1_000_000 else f"{size // 1000}k"


def _same_rows(vals: list[dict[str, Any] | None], sizes: list[int]) -> str:
    """For a page that shows more rows at the largest size: its growth from the first
    size that already showed as many (``, 0.98× from 1M at 50 rows``), or ''. A page
    may grow with what it shows; this is what it grew by beyond that."""
    last = vals[-1]
    for v, size in zip(vals[1:-1], sizes[1:-1], strict=True):
        if v and last and v.get("rows") == last.get("rows") and v.get("p50"):
            return f", {last['p50'] / v['p50']:.2f}× from {_short(size)} at {v['rows']} rows"
    return ""


def why(vals: list[dict[str, Any] | None], sizes: list[int]) -> str:
    """What changed between the smallest and the largest size, for a row over 1.3×."""
    first, last = vals[0], vals[-1]
    if not first or not last:
        return ""
    reasons = []
    if (first.get("rows") or 0) < (last.get("rows") or 0):
        reasons.append(f"shows {first['rows']} → {last['rows']} rows" + _same_rows(vals, sizes))
    if last["sql_ms"] - first["sql_ms"] > 1 and last["sql_ms"] > FLAT * first["sql_ms"]:
        reasons.append(f"SQL {first['sql_ms']:.1f} → {last['sql_ms']:.1f} ms")
    if last.get("buffers_read", 0) >= READS_WORTH_NAMING:
        reasons.append(f"reads {last['buffers_read']:.0f} blocks outside shared buffers")
    return "; ".join(reasons) or "same rows, SQL flat, few blocks read: noise"


def warm_table(cells: dict, sizes: list[int]) -> list[str]:
    """Method 2: in-process and gunicorn p50, SQL and Python, rows, reads, and why a
    row grew more than 1.3× (in either)."""
    at = lambda what: " | ".join(f"{what} at {s:,}" for s in sizes)  # noqa: E731
    out = [
        f"| page | user | {at('p50 ms')} | ratio | {at('HTTP p50 ms')} | HTTP ratio"
        f" | {at('SQL ms')} | {at('Python ms (rendering)')} | rows | blocks read"
        f" | over {FLAT}×: why |"
    ]
    out.append("|---|---|" + "---|" * (4 * len(sizes) + 5))
    tally: dict[str, int] = {}
    grown = 0
    for (page, user), by_size in cells.items():
        vals = [by_size.get(s) for s in sizes]
        ratio, http = _ratio(vals), _ratio(vals, "http_p50")
        grew = any(r is not None and r > FLAT for r in (ratio, http))
        reason = why(vals, sizes) if grew else ""
        if grew:
            grown += 1
            for part in reason.split("; "):
                tally[part.split(" ")[0]] = tally.get(part.split(" ")[0], 0) + 1
        fmt = lambda r: "—" if r is None else f"**{r:.2f}**" if r > FLAT else f"{r:.2f}"  # noqa: E731
        out.append(
            f"| {page} | {user} | {' | '.join(_cell(v) for v in vals)} | {fmt(ratio)}"
            f" | {' | '.join(_cell(v, 'http_p50') for v in vals)} | {fmt(http)}"
            f" | {' | '.join(_cell(v, 'sql_ms', '{:.2f}') for v in vals)}"
            f" | {' | '.join(_python(v) for v in vals)}"
            f" | {' / '.join(str(v.get('rows', '—')) if v else '—' for v in vals)}"
            f" | {_cell(vals[-1], 'buffers_read', '{:.0f}')} | {reason} |"
        )
    rows, over = len(cells), grown
    named = {"shows": "more rows shown", "SQL": "SQL grew", "reads": "blocks read", "same": "noise"}
    summary = ", ".join(f"{n} {named.get(what, what)}" for what, n in sorted(tally.items()))
    return [
        f"{over} of {rows} page × user rows grew more than {FLAT}× in-process or over HTTP"
        f" from {sizes[0]:,} to {sizes[-1]:,}"
        + (f" (reasons: {summary})" if summary else "")
        + ".",
        "",
        *out,
    ]


def plot(runs: Runs, label: str) -> None:
    """p50 vs log size per user: each page (grey), the worst and median page, before
    and ``label``, in-process (solid) and over gunicorn (dotted). No plot without
    matplotlib (bench/requirements.txt; a fresh ``make venv`` has none), as in ``_common``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("scale: matplotlib is not installed, no plot (pip install -r bench/requirements.txt)")
        return

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5), sharey=True)
    for ax, user in zip(axes, ("superuser", "scoped"), strict=True):
        for name, key, style in (
            ("before", "p50", "--"),
            (label, "p50", "-"),
            (label, "http_p50", ":"),
        ):
            if name not in runs:
                continue
            sizes = sorted(runs[name])
            by_page: dict[str, dict[int, float]] = {}
            for size in sizes:
                for r in runs[name][size]["results"]:
                    if r["user"] == user and r["status"] < 400 and key in r:
                        by_page.setdefault(r["page"], {})[size] = r[key]
            if not by_page:
                continue
            if name == label and key == "p50":
                for points in by_page.values():
                    xs = sorted(points)
                    ax.plot(xs, [points[x] for x in xs], color="0.8", linewidth=0.7)
            worst = [max(p[s] for p in by_page.values() if s in p) for s in sizes]
            median = [statistics.median(p[s] for p in by_page.values() if s in p) for s in sizes]
            where = "gunicorn" if key == "http_p50" else "in-process"
            for values, color, what in (
                (worst, "tab:red", "worst"),
                (median, "tab:blue", "median"),
            ):
                ax.plot(
                    sizes, values, style, marker="o", color=color, label=f"{what}, {name}, {where}"
                )
        ax.axhline(TARGET_MS, color="black", linestyle=":", linewidth=1, label="target 100 ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("changesets in the log")
        ax.set_title(f"every page, {user} (grey: each page, {label})")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("p50 ms")
    fig.tight_layout()
    fig.savefig(plots_dir() / "scale.png", dpi=100)


def plans(runs: Runs) -> None:
    """docs/benchmarks/scale-plans.md: each page's slowest statement at the largest size."""
    out = ["# Scale benchmark: the slowest statement of each page (EXPLAIN ANALYZE)\n"]
    for label in sorted(runs, key=lambda x: (x != "before", x)):
        size = max(runs[label])
        out.append(f"\n## {label}, {size:,} changesets\n")
        out.append("(Each page's slowest statement, re-run under EXPLAIN with its parameters.)")
        for r in runs[label][size]["results"]:
            out.append(
                f"\n### {r['page']} ({r['user']}): p50 {r['p50']:.1f} ms,"
                f" {r['queries']} statements, slowest {r['slowest_query_ms']:.1f} ms\n"
            )
            out.append("```\n" + r["plan"].strip() + "\n```")
    (plots_dir() / "scale-plans.md").write_text("\n".join(out) + "\n")
