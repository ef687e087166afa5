"""The docs section, plot and plans file of bench/keys_blame_diff.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from _common import image, plots_dir

TITLE = "Key-level history, blame and diff vs total revisions (issue 16)"
NOTES = Path(__file__).resolve().parent / "keys_notes.md"
FLAT = 1.3
# Requests the flatness target covers (issue 16: blame and key-filtered history).
TARGETED = ("blame", "history ?key", "revisions ?key")
# Plans shown in the section itself (the rest go to docs/benchmarks/keys-plans.md).
SHOWN_PLANS = (
    "blame (",
    "history ?key=/profile/email",
    "revisions ?key=/payload",
    "/diff A→B, first",
)


def size_label(n: int) -> str:
    return f"{n / 1_000_000:g}M" if n >= 1_000_000 else f"{n / 1000:g}k"


def report(results: list[dict[str, Any]], skipped: list, args: argparse.Namespace) -> str:
    if not results:
        return "_No size measured._"
    sizes = [r["total"] for r in results]
    labels = list(results[0]["results"])
    fx = results[0]["fixtures"]["shape"]
    lines = [
        f"Fixtures (through the write service, on top of bench/history_pages.py's log): {fx[0]}"
        f" blame entities in `bench.hist` with {fx[1]} revisions each, a namespace of"
        f" {fx[2]:,} entities for the diff. Sizes interleaved: one in-process server per"
        " size (Django's test client, token auth), driven in lockstep, each request at every"
        f" size in turn, {args.repeat} rounds (a request whose rounds have taken"
        f" {args.seconds:.0f} s stops at three); warm: every request once at every size"
        " before timing (its pages are then in PostgreSQL's shared buffers or the OS page"
        " cache). SQL ms: the statements' time at the client (bench/_sqltime.py); rows:"
        " entries returned (blame: leaves; a walk: all pages).",
        "",
    ]
    if NOTES.exists():
        lines += [NOTES.read_text().rstrip(), ""]
    lines += [table(results, sizes, labels), "", verdicts(results, sizes, labels)]
    lines += ["", populations(results)]
    for total, why in skipped:
        lines.append(f"\n{total:,} revisions: not measured ({why}).")
    draw(results, sizes, labels)
    shown = image("keys_blame_diff.png", "p50 of each key-level request vs total revisions")
    if shown:
        lines += ["", shown]
    lines += ["", plans(results[-1])]
    return "\n".join(lines)


def table(results: list[dict[str, Any]], sizes: list[int], labels: list[str]) -> str:
    heads = [f"p50 ms at {size_label(s)}" for s in sizes]
    heads += ["ratio", f"p95 ms at {size_label(sizes[-1])}"]
    heads += [f"SQL ms at {size_label(s)}" for s in sizes]
    heads += ["statements", "rows"]
    out = ["| request | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for label in labels:
        cells = [r["results"][label] for r in results]
        ratio = cells[-1]["p50"] / cells[0]["p50"] if len(cells) > 1 else float("nan")
        row = [f"{c['p50']:.2f}" for c in cells]
        row += [_ratio(ratio, label), f"{cells[-1]['p95']:.2f}"]
        row += [f"{c['sql_ms']:.2f}" for c in cells]
        row += [str(cells[-1]["queries"]), f"{cells[-1]['rows']:,}"]
        out.append(f"| {label} | " + " | ".join(row) + " |")
    return "\n".join(out)


def _ratio(ratio: float, label: str) -> str:
    if ratio != ratio:
        return "–"
    text = f"{ratio:.2f}"
    return f"**{text}**" if ratio > FLAT and label.startswith(TARGETED) else text


def verdicts(results: list[dict[str, Any]], sizes: list[int], labels: list[str]) -> str:
    if len(sizes) < 2:
        return "One size only: no ratio."
    first, last = results[0]["results"], results[-1]["results"]
    targeted = [label for label in labels if label.startswith(TARGETED)]
    over = [
        f"{label} ({last[label]['p50'] / first[label]['p50']:.2f}×)"
        for label in targeted
        if last[label]["p50"] / first[label]["p50"] > FLAT
    ]
    span = f"{size_label(sizes[0])} to {size_label(sizes[-1])} revisions"
    if not over:
        return f"**Target met**: every blame and key-filtered request within {FLAT}× from {span}."
    return (
        f"**Over {FLAT}× from {span}** (wall p50): " + "; ".join(over) + f". The other"
        f" {len(targeted) - len(over)} blame and key-filtered requests are within {FLAT}×."
    )


def populations(results: list[dict[str, Any]]) -> str:
    parts = []
    for r in results:
        f = r["fixtures"]
        made = f"populated in {r['populate_s']:.0f} s" if r["populate_s"] else "population reused"
        fixture = (
            f"fixtures written in {f['seconds']:.0f} s" if f["written_now"] else "fixtures reused"
        )
        parts.append(f"{r['total']:,} revisions: {made}, {fixture}")
    return "Databases: " + "; ".join(parts) + "."


def draw(results: list[dict[str, Any]], sizes: list[int], labels: list[str]) -> None:
    """p50 vs total revisions of each targeted request, a colour and marker each."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    colours = plt.get_cmap("tab20").colors
    markers = "osD^v<>pPX*h"
    targeted = [label for label in labels if label.startswith(TARGETED)]
    for i, label in enumerate(targeted):
        ys = [r["results"][label]["p50"] for r in results]
        ax.plot(sizes, ys, marker=markers[i % len(markers)], color=colours[i % 20], label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title("Blame and key-filtered history vs total revisions (p50)")
    ax.set_xlabel("revisions in the log")
    ax.set_ylabel("ms (in-process client)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(plots_dir() / "keys_blame_diff.png")
    plt.close(fig)


def plans(result: dict[str, Any]) -> str:
    """Some plans inline; every request's slowest statement in keys-plans.md."""
    size = size_label(result["total"])
    every = [f"# Key-level requests at {result['total']:,} revisions: slowest statements\n"]
    inline = [f"EXPLAIN (ANALYZE, BUFFERS) of the slowest statement, at {size} revisions:"]
    for label, r in result["results"].items():
        block = (
            f"\n{label}: {r['queries']} statements, the slowest by its plan shown\n\n"
            f"```\n{r['plan'].strip()}\n```"
        )
        every.append(f"\n## {label}\n{block}")
        if label.startswith(SHOWN_PLANS):
            inline.append(block)
    (plots_dir() / "keys-plans.md").write_text("\n".join(every) + "\n")
    inline.append("\nEvery request's: `docs/benchmarks/keys-plans.md`.")
    return "\n".join(inline)
