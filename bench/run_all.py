"""The whole benchmark suite against the peers, in one run: ``make bench``.

    .venv/bin/python bench/run_all.py [--smoke] [--only writes,http,...] [--doc PATH] [--plots DIR]

Runs each part as its own process (each binds Django to its database once), in
this order, each with a time limit:

    writes   bench/writes_vs_peers.py   1 single writes, 2 batches, 7 storage (+ profile)
    http     bench/http_throughput.py   6 gunicorn PUT throughput, Atlas vs plain DRF
    feed     bench/feed_lag.py          5 feed page time, commit-to-receipt lag
    asof     bench/asof_vs_peers.py     4 as-of pages vs depth, vs django-simple-history
    legacy   bench/asof.py, bench/batch_write.py (refresh their own sections)
    history  bench/history_pages.py     3 history page at 10k / 1M / 10M revisions, Atlas
                                        and the peers (bench/history_vs_peers.py)
    keys     bench/keys_blame_diff.py   3b blame, key-filtered history, /revisions by key
                                        and /diff, on the history part's databases

then writes the summary section (targets met or missed, by how much) and
leaves every part's own section and plot in docs/benchmarks.md and
docs/benchmarks/. ``--smoke`` is the CI-size version: tiny sizes, its own
database (``atlas_bench_smoke``), and (unless told otherwise) a scratch doc.
Without the peers installed (``pip install -r bench/requirements.txt``) the
suite measures Atlas, the plain baseline and raw psycopg only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _bytes_growth import TARGET, against_peers  # noqa: E402
from _common import bench_env, header, image, machine, table, versions  # noqa: E402
from _http_report import of_rounds, paired  # noqa: E402
from _setup import doc_path, setup, write_section  # noqa: E402

SUMMARY = "Against the peers: summary"
WHY = "Against the peers: each target, and why Atlas meets or misses it"
# The sections this suite owns, in reading order (created empty on the first run, so
# each part's section lands in its place whatever order the parts run in).
SECTIONS = [
    SUMMARY,
    WHY,
    "Against the peers 1. Single-entity writes",
    "Against the peers 2. Batches as one transaction",
    "Against the peers 3. Entity history page vs total revisions",
    "Against the peers 4. As-of pages vs depth",
    "Against the peers 5. Change feed",
    "Against the peers 6. HTTP throughput (gunicorn)",
    "Against the peers 7. Storage per revision",
    "Against the peers: profile of Atlas's single-entity write",
    "Key-level history, blame and diff vs total revisions (issue 16)",
]
# name, script, full-run args, smoke args, time limit (s) for the full run
PARTS = [
    ("writes", "writes_vs_peers.py", ["--profile"], ["--smoke"], 600),
    # Three rounds of blocks of 20 s ×4 ×3 client counts (about 13 min), each Atlas block's
    # drain, and first the drain of whatever backlog the earlier parts left
    # (http_throughput.py --drain-timeout). One round's ratio moves by ±15 points on a
    # shared 2-core machine; the verdicts are the median of the three rounds'.
    ("http", "http_throughput.py", ["--rounds", "3"], ["--smoke"], 2400),
    ("feed", "feed_lag.py", [], ["--smoke"], 240),
    ("asof", "asof_vs_peers.py", [], ["--smoke"], 600),
    (
        "legacy-asof",
        "asof.py",
        [],
        ["--entities", "200", "--updates-per-entity", "10", "--repeat", "3", "--page", "50"],
        300,
    ),
    (
        "legacy-batch",
        "batch_write.py",
        [],
        ["--ops", "50", "--rounds", "1", "--singles", "10"],
        240,
    ),
    ("history", "history_pages.py", [], ["--smoke"], 1200),
    # After history: the same databases (and only those history populated: --reuse-only).
    ("keys", "keys_blame_diff.py", ["--reuse-only"], ["--smoke"], 1800),
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: the CI smoke test")
    parser.add_argument("--only", default="", help="comma-separated part names")
    parser.add_argument("--skip", default="", help="comma-separated part names")
    parser.add_argument(
        "--doc", default=None, help="markdown to write (default docs/benchmarks.md)"
    )
    parser.add_argument(
        "--plots", default=None, help="folder for the PNGs (default docs/benchmarks)"
    )
    parser.add_argument(
        "--history-sizes", default="10000,1000000,10000000", help="revisions per history stage"
    )
    parser.add_argument("--budget-minutes", type=float, default=40, help="for the whole run")
    args = parser.parse_args()
    bench_env()
    if args.doc:
        os.environ["ATLAS_BENCH_DOC"] = str(Path(args.doc).resolve())
    if args.plots:
        os.environ["ATLAS_BENCH_PLOTS"] = str(Path(args.plots).resolve())
    if args.smoke:
        os.environ.setdefault("ATLAS_BENCH_DB", "atlas_bench_smoke")
    only = {p for p in args.only.split(",") if p}
    skip = {p for p in args.skip.split(",") if p}
    started = time.monotonic()
    load_start = machine()["load"]
    setup(settings="bench.settings", database=os.environ.get("ATLAS_BENCH_DB"))
    from django.conf import settings

    peers = bool(getattr(settings, "BENCH_PEERS", False))
    print(
        f"bench: peers {'installed' if peers else 'NOT installed (Atlas, plain, raw only)'};"
        f" load average {load_start}",
        flush=True,
    )
    existing = doc_path().read_text() if doc_path().exists() else ""
    for title in SECTIONS:
        if f"## {title}\n" not in existing:
            write_section(title, "_Not measured yet: run `make bench`._")
    write_section(SUMMARY, "_Run in progress…_")

    # Each part's results are kept (git-ignored .atlas/bench-results, or a scratch folder for
    # smoke runs), so a rerun of some parts (--only) still gets a summary of all of them.
    results_dir = (
        Path(tempfile.mkdtemp(prefix="atlas-bench-"))
        if args.smoke
        else BENCH.parent / ".atlas" / "bench-results"
    )
    results_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for stored in results_dir.glob("*.json"):
        results[stored.stem] = json.loads(stored.read_text())
    failures: dict[str, str] = {}
    scratch = Path(tempfile.mkdtemp(prefix="atlas-bench-"))
    when: dict[str, str] = {
        name: f"{r.get('_when', '?')}, load {r.get('_load', '?')}" for name, r in results.items()
    }
    for name, script, full_args, smoke_args, limit in PARTS:
        if (only and name not in only) or name in skip:
            continue
        argv = [sys.executable, str(BENCH / script), *(smoke_args if args.smoke else full_args)]
        if name == "history" and not args.smoke:
            # The history part goes last and gets what is left of the run's budget: a
            # size whose population would not fit is skipped, and the doc says so.
            left = args.budget_minutes * 60 - (time.monotonic() - started) - 30
            argv += ["--sizes", args.history_sizes, "--budget", f"{max(left, 60):.0f}"]
            limit = max(left, 60) + 300
        if name == "keys" and not args.smoke:
            argv += ["--sizes", args.history_sizes]
        out = scratch / f"{name}.json"
        if not name.startswith("legacy"):
            argv += ["--json", str(out)]
        part_started = time.monotonic()
        m = machine()
        print(f"bench: {name} ({' '.join(argv[1:])}), load {m['load']} ...", flush=True)
        try:
            run_part(argv, limit)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            failures[name] = str(exc)
            print(f"bench: {name} FAILED: {exc}", flush=True)
        if out.exists():
            result = json.loads(out.read_text())
            result["_when"] = m["date"]
            result["_load"] = f"{m['load'][0]:.2f}"
            result["_seconds"] = round(time.monotonic() - part_started)
            results[name] = result
            when[name] = f"{m['date']}, load {m['load'][0]:.2f}"
            (results_dir / f"{name}.json").write_text(json.dumps(result, default=str))
        print(f"bench: {name} took {time.monotonic() - part_started:.0f} s", flush=True)

    total = time.monotonic() - started
    text = summary_text(results, failures, peers, args, total, load_start)
    text += "\n\nWhen each part's figures above were measured (1-minute load average at its start):"
    text += " " + "; ".join(f"{name} {when[name]}" for name in sorted(when)) + "."
    write_section(SUMMARY, text)
    print(text)
    return 1 if failures else 0


def run_part(argv: list[str], limit: float) -> None:
    """Run one part; past ``limit``, SIGTERM it first (so it stops the servers it started
    and deletes its broker queue), SIGKILL only if it has not stopped a minute later."""
    with subprocess.Popen(argv, cwd=BENCH.parent) as process:
        try:
            process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            raise
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, argv)


def fmt_ratio(value: float) -> str:
    return "–" if value != value else f"{value:.2f}×"


def summary_text(results, failures, peers, args, total, load_start) -> str:
    """The targets table, headline numbers and plots, from the parts' JSON."""
    nan = float("nan")
    cmd = "make bench-smoke" if args.smoke else "make bench"
    v = versions()
    lines = [
        header(cmd).replace("this part", "the run"),
        f"The whole run took {total / 60:.1f} min.",
        "Peers: "
        + (
            ", ".join(
                f"{p} {v[p]}"
                for p in ("django-simple-history", "django-reversion", "django-pghistory")
                if p in v
            )
            if peers
            else "**not installed** (`pip install -r bench/requirements.txt`): Atlas, plain and"
            " raw psycopg only"
        )
        + f"; DRF {v.get('djangorestframework', '?')}, gunicorn {v.get('gunicorn', '?')},"
        f" Celery {v.get('celery', '?')}, psycopg {v.get('psycopg', '?')}.",
        "",
        "Medians, and ratios to a baseline measured in the same run; each part's section below"
        " has the details, p95/p99 and the method.",
        "",
    ]
    rows = []
    w = results.get("writes", {})
    single = w.get("single", {})
    if single:
        a = single.get("Atlas service", {})
        peers_txt = ", ".join(
            f"{k.replace('django-', '')} {fmt_ratio(single[k]['ratio'])}"
            for k in ("django-pghistory", "django-simple-history", "django-reversion")
            if k in single
        )
        rows.append(
            [
                "1 single-entity write, Atlas service p50 vs plain get()+save()"
                " (authorization included, as a request pays it)",
                "≤ 1.2×",
                f"{fmt_ratio(a.get('ratio', nan))} ({a.get('p50', nan):.2f} vs"
                f" {single['plain get()+save()']['p50']:.2f} ms)",
                verdict(a.get("ratio", nan) <= 1.2, a.get("ratio", nan), 1.2),
                peers_txt or "–",
            ]
        )
        h = single.get("Atlas PUT (in-process HTTP)", {})
        ph = single.get("plain DRF endpoint (in-process HTTP)", {})
        if h and ph:
            rows.append(
                [
                    "1 single-entity write over HTTP (in-process), Atlas PUT vs plain DRF endpoint",
                    "–",
                    f"{h['p50'] / ph['p50']:.2f}× ({h['p50']:.2f} vs {ph['p50']:.2f} ms)",
                    "",
                    "",
                ]
            )
    batch = w.get("batch", {}).get("impls", {})
    if batch:
        a = batch.get("Atlas service (one changeset)", {})
        size = w["batch"]["size"]
        peers_txt = ", ".join(
            f"{k.replace('django-', '').replace(' save() loop', '')} {fmt_ratio(v['ratio'])}"
            for k, v in batch.items()
            if k.endswith("save() loop") and not k.startswith("plain")
        )
        rows.append(
            [
                f"2 {size}-row batch, Atlas one changeset vs plain save() loop",
                "≤ 0.5×",
                f"{fmt_ratio(a.get('ratio', nan))} ({a.get('p50', nan):.0f} vs"
                f" {batch['plain save() loop']['p50']:.0f} ms; {a.get('queries', '?')} queries"
                f" vs {batch['plain save() loop']['queries']})",
                verdict(a.get("ratio", nan) <= 0.5, a.get("ratio", nan), 0.5),
                peers_txt or "–",
            ]
        )
    hist = results.get("history", {}).get("sizes", [])
    if hist:
        first, last = hist[0], hist[-1]
        ratio = last["selector"]["p50"] / first["selector"]["p50"]
        peers_txt = ", ".join(
            f"{peer.replace('django-', '')} {fmt_ratio(m['p50'] / first['peers'][peer]['p50'])}"
            f" ({m['p50']:.2f} vs {first['peers'][peer]['p50']:.2f} ms)"
            for peer, m in last.get("peers", {}).items()
            if peer in first.get("peers", {})
        )
        rows.append(
            [
                f"3 history page at {last['revisions']:,} vs {first['revisions']:,} revisions",
                "≤ 1.3×",
                f"{fmt_ratio(ratio)} ({last['selector']['p50']:.2f} vs"
                f" {first['selector']['p50']:.2f} ms)",
                verdict(ratio <= 1.3, ratio, 1.3),
                peers_txt or "peers not measured in this run",
            ]
        )
        for total_, why in results["history"].get("skipped", []):
            rows.append([f"3 history page at {total_:,} revisions", "", "not measured", why, ""])
    rows += keys_rows(results.get("keys", {}))
    asof = results.get("asof", {}).get("rows", {})
    if asof.get("Atlas"):
        atlas = asof["Atlas"]
        cur = atlas["current"]["p50"]
        depths = [k for k in atlas if k != "current"]
        worst = max(depths, key=lambda d: atlas[d]["p50"])
        ratio = atlas[worst]["p50"] / cur
        sh = asof.get("django-simple-history", {})
        sh_txt = ", ".join(
            f"{int(d):,} back {sh[d]['p50']:.0f} ms" if "p50" in sh.get(d, {}) else f"{d}: timeout"
            for d in depths
            if d in sh
        )
        rows.append(
            [
                f"4 as-of page, worst depth ({int(worst):,} back) vs current",
                "≤ 2×",
                f"{fmt_ratio(ratio)} ({atlas[worst]['p50']:.2f} vs {cur:.2f} ms)",
                verdict(ratio <= 2, ratio, 2),
                f"simple-history as_of: {sh_txt}" if sh_txt else "–",
            ]
        )
    feed = results.get("feed", {})
    if feed:
        page = feed["page"]
        rows.append(
            [
                f"5 feed page of {page['records']:.0f} records (server, in-process)",
                "–",
                f"{page['selector']['p50']:.1f} ms; over HTTP {page['http']['p50']:.1f} ms",
                "",
                "",
            ]
        )
        for mode, lag in feed.get("lag", {}).items():
            rows.append(
                [
                    f"5 commit → subscriber lag, {mode}",
                    "–",
                    f"p50 {lag['p50']:.0f} ms, p99 {lag['p99']:.0f} ms"
                    f" ({lag['received']}/{lag['written']} received)",
                    "",
                    "",
                ]
            )
    http = results.get("http", {})
    if http.get("results", {}).get("atlas"):
        rows += http_rows(http)
    storage = w.get("storage", {}).get("per_write", {})
    if storage:
        rows += bytes_rows(storage)
    rows += batch_bytes_rows(w.get("storage", {}).get("per_batch_op", {}))
    lines.append(table(["measure", "target", "Atlas", "verdict", "peers (same run)"], rows))
    if failures:
        lines += ["", "**Parts that failed in this run:**", ""]
        lines += [f"- `{name}`: {why}" for name, why in failures.items()]
    plots = [
        ("history_page_vs_revisions.png", "history page time vs total revisions"),
        ("asof_vs_depth.png", "as-of page time vs depth"),
        ("throughput_vs_clients.png", "throughput vs concurrent clients"),
        ("batch_time_vs_size.png", "batch time vs batch size"),
    ]
    shown = [image(name, alt) for name, alt in plots]
    shown = [s for s in shown if s]
    if shown:
        lines += ["", *[s + "\n" for s in shown]]
    return "\n".join(lines)


def keys_rows(keys: dict) -> list[list[str]]:
    """Part 3b: the worst blame / key-filtered ratio, and the 10,000-entity diff."""
    sizes = keys.get("sizes", [])
    if len(sizes) < 2:
        return []
    first, last = sizes[0]["results"], sizes[-1]["results"]
    targeted = [k for k in first if k.startswith(("blame", "history ?key", "revisions ?key"))]
    worst = max(targeted, key=lambda k: last[k]["p50"] / first[k]["p50"])
    ratio = last[worst]["p50"] / first[worst]["p50"]
    span = f"{sizes[-1]['total']:,} vs {sizes[0]['total']:,} revisions"
    out = [
        [
            f"3b blame and key-filtered history at {span}, worst of {len(targeted)} requests",
            "≤ 1.3×",
            f"{fmt_ratio(ratio)}: {worst} ({last[worst]['p50']:.2f} vs"
            f" {first[worst]['p50']:.2f} ms)",
            verdict(ratio <= 1.3, ratio, 1.3),
            "no peer has blame or key history",
        ]
    ]
    walks = [k for k in last if k.startswith("/diff") and "all pages" in k]
    for k in walks:
        out.append(
            [
                f"3b {k} at {sizes[-1]['total']:,} revisions",
                "–",
                f"p50 {last[k]['p50']:.0f} ms ({last[k]['pages']} pages, {last[k]['rows']:,}"
                f" entries; {first[k]['p50']:.0f} ms at {sizes[0]['total']:,})",
                "",
                "",
            ]
        )
    for total_, why in keys.get("skipped", []):
        out.append([f"3b key-level reads at {total_:,} revisions", "", "not measured", why, ""])
    return out


def http_rows(http: dict) -> list[list[str]]:
    """Part 6's targets as http_throughput.py judged them (worker running, nothing
    published by hand): throughput over block + drain, backlog, CPU."""
    if any("sustained" not in a for a in http["results"]["atlas"].values()):
        why = "stored result from the old benchmark (no worker): rerun with `--only http`"
        return [["6 HTTP PUT, Atlas vs plain DRF", "≥ 70%", why, "not measured", ""]]
    out = []
    for clients in sorted(http["results"]["atlas"], key=int):
        a, p = http["results"]["atlas"][clients], http["results"]["plain"][clients]
        pair = paired(a, p)
        share = pair["share"]
        out.append(
            [
                f"6 HTTP PUT, {clients} client(s): Atlas vs plain DRF, over block + drain",
                "≥ 70%",
                f"{share:.0%} ({of_rounds(pair, 'share')}pooled {a['sustained']:.0f} vs"
                f" {p['sustained']:.0f} PUT/s;"
                f" in block {a['throughput']:.0f}; p99 {a['p99']:.0f} vs {p['p99']:.0f} ms)",
                "met" if share >= 0.7 else f"**missed** by {0.7 - share:.0%} points",
                "",
            ]
        )
    for target in http.get("targets", []):
        if target["target"].startswith("Atlas PUT/s"):
            continue
        out.append(
            [
                f"6 HTTP, {target['clients']} client(s): {target['target']}",
                "",
                target["value"],
                "met" if target["met"] else "**missed**",
                "",
            ]
        )
    return out


def verdict(ok: bool, value: float, target: float) -> str:
    if value != value:
        return "not measured"
    if ok:
        return "met"
    return f"**missed** ({value / target:.1f}× the target)"


def bytes_rows(per_write: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Summary rows 7: Atlas's bytes per single write against the smallest peer's, as a
    service call records it and with what each records of a request (growth, part 7)."""
    rows = []
    for atlas, with_request, what in (
        ("Atlas (service", False, "a service write"),
        ("Atlas (HTTP", True, "with what a request records"),
    ):
        found = against_peers(per_write, atlas, with_request)
        if found is None:
            continue
        shown = ", ".join(
            f"{k.split(' (')[0].replace('django-', '')} {v:,.0f} B" for k, v in found.peers.items()
        )
        rows.append(
            _bytes_row(
                f"7 log bytes per single-entity write, {what} (growth over the run's writes)",
                found,
                shown,
            )
        )
    return rows


def batch_bytes_rows(per_op: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Summary row 7b: Atlas's bytes per op of a 1,000-op batch against the smallest of
    the peers' batch paths (growth, part 7); [] when not measured."""
    found = against_peers(per_op)
    if found is None:
        return []
    shown = ", ".join(f"{k.replace('django-', '')} {v:,.0f} B" for k, v in found.peers.items())
    return [
        _bytes_row(
            "7b log bytes per op of a 1,000-op batch (growth over the run's batches)", found, shown
        )
    ]


def _bytes_row(measure: str, found: Any, shown: str) -> list[str]:
    """A summary row of bytes against the smallest peer (``_bytes_growth.against_peers``)."""
    verdict = ""
    if found.ratio is not None:
        met = "met" if found.ratio <= TARGET else "**missed**"
        verdict = f"{met} ({found.ratio:.2f}× the smallest)"
    return [measure, "≤ 2× the smallest peer", f"{found.mine:,.0f} B", verdict, shown or "–"]


if __name__ == "__main__":
    sys.exit(main())
