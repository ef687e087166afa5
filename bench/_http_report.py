"""The HTTP benchmark's targets (issue 15) and its sections of docs/benchmarks.md."""

from __future__ import annotations

from statistics import median
from typing import Any

from _common import header, image, plot, table
from _cpu import GROUPS

CPU_TARGET = 1.5  # whole-machine CPU per Atlas PUT, × plain's
CPU_COLUMNS = [*GROUPS, "server", "whole machine"]
CPU_LABELS = {
    "web": "web",
    "worker": "worker",
    "postgres": "PostgreSQL",
    "loadgen": "load generator",
    "server": "server side (web + worker + PostgreSQL)",
    "whole machine": "whole machine",
}


def share_target(subscription: bool) -> float:
    return 0.6 if subscription else 0.7


def backlog_seconds(block: dict[str, Any]) -> float:
    """The backlog at a block's end, in seconds of that block's writes."""
    return block["backlog_end"] / block["in_block"] if block["in_block"] else float("inf")


def round_ratios(atlas: dict[str, Any], plain: dict[str, Any]) -> dict[str, float]:
    """Atlas/plain throughput over block + drain and CPU per PUT, of one round's
    aggregates (or of all blocks pooled)."""
    return {
        "share": atlas["sustained"] / plain["sustained"],
        "cpu": atlas["cpu_ms_per_put"]["whole machine"] / plain["cpu_ms_per_put"]["whole machine"],
        "atlas": atlas["sustained"],
        "plain": plain["sustained"],
    }


def paired(atlas: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """The ratios a verdict rests on: the median of the rounds' own ratios (each round
    pairs blocks a minute apart), with their range; one round is just its ratio.
    Results stored before rounds existed have no ``pairs``: their pooled ratio."""
    pairs = atlas.get("pairs") or [round_ratios(atlas, plain)]
    shares, cpus = [x["share"] for x in pairs], [x["cpu"] for x in pairs]
    return {
        "rounds": len(pairs),
        "share": median(shares),
        "cpu": median(cpus),
        "share_range": f"{min(shares):.0%}–{max(shares):.0%}",
        "cpu_range": f"{min(cpus):.2f}–{max(cpus):.2f}×",
    }


def of_rounds(pair: dict[str, Any], key: str) -> str:
    """How a median was taken, for the targets' "measured" column."""
    if pair["rounds"] == 1:
        return ""
    return f"median of {pair['rounds']} rounds, {pair[key + '_range']}; "


def targets(results: dict[str, Any], levels: list[int], subscription: bool) -> list[dict]:
    """Issue 15's targets at each client count: value, and met or not."""
    want = share_target(subscription)
    rows = []
    for c in levels:
        a, p = results["atlas"][c], results["plain"][c]
        pair = paired(a, p)
        share = pair["share"]
        rows.append(
            {
                "target": f"Atlas PUT/s over block + drain ≥ {want:.0%} of plain",
                "clients": c,
                "value": f"{share:.0%} ({of_rounds(pair, 'share')}pooled {a['sustained']:.0f}"
                f" vs {p['sustained']:.0f} PUT/s)",
                "met": share >= want,
            }
        )
        worst = max(a["blocks"], key=backlog_seconds)
        rows.append(
            {
                "target": "journal backlog at every block end < 1 s of writes",
                "clients": c,
                "value": f"worst {worst['backlog_end']:,} entries"
                f" = {backlog_seconds(worst):.1f} s of writes",
                "met": all(backlog_seconds(b) < 1 for b in a["blocks"]),
            }
        )
        ratio = pair["cpu"]
        rows.append(
            {
                "target": f"whole-machine CPU per Atlas PUT ≤ {CPU_TARGET}× plain's",
                "clients": c,
                "value": f"{ratio:.2f}× ({of_rounds(pair, 'cpu')}pooled"
                f" {a['cpu_ms_per_put']['whole machine']:.1f} vs"
                f" {p['cpu_ms_per_put']['whole machine']:.1f} ms)",
                "met": ratio <= CPU_TARGET,
            }
        )
    return rows


def verdict(met: bool) -> str:
    return "met" if met else "**missed**"


def throughput_table(results: dict[str, Any], levels: list[int]) -> str:
    rows = []
    for c in levels:
        a, p = results["atlas"][c], results["plain"][c]
        rows.append(
            [
                c,
                p["throughput"],
                a["throughput"],
                f"{a['throughput'] / p['throughput']:.0%}",
                " / ".join(f"{b['backlog_end']:,}" for b in a["blocks"]),
                " / ".join(f"{b['drain_s']:.1f}" for b in a["blocks"]),
                a["sustained"],
                f"{a['sustained'] / p['sustained']:.0%}",
                f"{p['p50']:.1f} / {p['p99']:.1f}",
                f"{a['p50']:.1f} / {a['p99']:.1f}",
                p["errors"] + a["errors"],
            ]
        )
    heads = ["clients", "plain PUT/s", "Atlas PUT/s in block", "Atlas / plain in block"]
    heads += ["Atlas backlog at block ends", "drain s", "Atlas PUT/s over block + drain"]
    heads += ["Atlas / plain over block + drain", "plain p50 / p99 ms", "Atlas p50 / p99 ms"]
    return table([*heads, "errors"], rows)


def rounds_table(results: dict[str, Any], levels: list[int]) -> str:
    """Each round's pair at each client count: the ratios the medians are taken of."""
    rows = []
    for c in levels:
        for i, x in enumerate(results["atlas"][c].get("pairs", []), 1):
            rows.append(
                [c, i, f"{x['plain']:.0f}", f"{x['atlas']:.0f}", f"{x['share']:.0%}"]
                + [f"{x['cpu']:.2f}×"]
            )
    heads = ["clients", "round", "plain PUT/s", "Atlas PUT/s over block + drain"]
    return table([*heads, "Atlas / plain", "whole-machine CPU per PUT, Atlas / plain"], rows)


def cpu_table(results: dict[str, Any], levels: list[int]) -> str:
    rows = []
    for c in levels:
        a, p = results["atlas"][c]["cpu_ms_per_put"], results["plain"][c]["cpu_ms_per_put"]
        rows.append([c, "plain", *[p[k] for k in CPU_COLUMNS], p["redis"]])
        rows.append([c, "Atlas", *[a[k] for k in CPU_COLUMNS], a["redis"]])
        # A ratio to almost nothing (plain's worker is idle) says nothing: "–".
        ratios = [f"{a[k] / p[k]:.2f}×" if p[k] >= 0.1 else "–" for k in CPU_COLUMNS]
        rows.append([c, "Atlas / plain", *ratios, "–"])
    heads = ["clients", "", *[CPU_LABELS[k] for k in CPU_COLUMNS], "broker (Redis), not summed"]
    return table(heads, rows)


def processes(info: dict[str, Any]) -> list[str]:
    """Exactly which processes, broker, pool and subscriptions ran."""
    subs = (
        "one active subscription (all namespaces, started now) to a receiver in the load"
        f" generator's process that answers 204 ({info['posts']:,} deliveries,"
        f" {info['post_bytes'] / 1e6:.1f} MB); drained = no journal entry `committed` and the"
        " subscription's cursor at the newest seq as of the load's end"
        if info["subscription"]
        else "no active subscription (drained = no journal entry `committed`)"
    )
    return [
        "Production shape, started as `make run` starts it (`atlas.devrun.commands`), with"
        " `DJANGO_SETTINGS_MODULE=bench.settings` (Atlas plus the plain endpoint) on the"
        " benchmark database:",
        "",
        f"- web: `{info['web_cmd']}` (access log on, to a file);",
        f"- worker: `{info['worker_cmd']}`: pool concurrency {info['concurrency']}, Celery's"
        " default; the journal relay in its main process, beat embedded;",
        f"- broker: {info['broker']};",
        f"- {subs}; subscriptions of earlier runs deactivated ({info['deactivated']});",
        "- nothing is published by hand: before the first block the worker drained the"
        f" {info['initial_backlog']:,} journal entries the database held, and the warm-up's"
        f" ({info['initial_drain_s']:.1f} s).",
        "",
    ]


def method(info: dict[str, Any]) -> str:
    """How the load ran and how CPU was counted."""
    return (
        f"Client threads in the load generator on the same {info['cores']} cores, a new TCP"
        f" connection per request, {info['keys']} keys per client. After the load: the"
        " journal backlog (entries `committed`) at its end, then the drain (no load, polled"
        " every 0.1 s); throughput over load + drain = successful PUTs / (load + drain"
        " seconds). CPU by psutil (user + system, reaped children included), over load +"
        " drain, per successful PUT: web = gunicorn master + workers; worker = celery main"
        " process + its children; PostgreSQL = the server's postmaster, its shared processes"
        " and every session on the benchmark database, sampled every 0.25 s (a session that"
        " ends keeps all but its last 0.25 s; sessions on other databases are other jobs' and"
        " left out); load generator = the benchmark process. Busy CPU outside these and Redis"
        f" (other jobs): at most {info['other_cpu_share']:.0%} of the machine's in any"
        " measured interval"
        + (" — **the machine was not quiet**." if info["other_cpu_share"] > 0.1 else ".")
    )


def main_section(info: dict[str, Any], results: dict[str, Any], levels: list[int]) -> str:
    rows = targets(results, levels, info["subscription"])
    suffix = "_subscription" if info["subscription"] else ""
    name = f"throughput_vs_clients{suffix}.png"
    atlas, plain = results["atlas"], results["plain"]
    xs = [float(c) for c in levels]
    plot(
        name,
        {
            "Atlas, over block + drain": (xs, [atlas[c]["sustained"] for c in levels]),
            "Atlas, in block": (xs, [atlas[c]["throughput"] for c in levels]),
            "plain DRF UpdateAPIView": (xs, [plain[c]["throughput"] for c in levels]),
        },
        title="PUT throughput vs clients (gunicorn 2 workers + Celery worker)",
        xlabel="concurrent clients",
        ylabel="successful PUTs per second",
        ymin0=True,
    )
    lines = [header(info["cmd"]), "", *processes(info), method(info)]
    rounds = info.get("rounds", 1)
    lines += [
        f"At each client count, blocks of {info['seconds']:.0f} s in the order plain, Atlas,"
        " Atlas, plain (drain after each Atlas block)"
        + (
            f"; {rounds} such rounds, each going through every client count in turn. The"
            " targets are judged on the median of the rounds' own ratios (each round's two"
            " Atlas blocks against its two plain blocks, at most a few minutes apart), so"
            " one disturbed block moves one round, not the verdict; the tables before the"
            " targets pool every block."
            if rounds > 1
            else "."
        ),
        "",
    ]
    if rounds > 1:
        lines += ["Each round's pair:", "", rounds_table(results, levels), ""]
    lines += [throughput_table(results, levels), ""]
    lines += ["CPU per successful PUT, ms (over block + drain):", "", cpu_table(results, levels)]
    lines += ["", "Targets (issue 15):", ""]
    lines.append(
        table(
            ["target", "clients", "measured", "verdict"],
            [[r["target"], r["clients"], r["value"], verdict(r["met"])] for r in rows],
        )
    )
    lines += ["", image(name, "throughput vs concurrent clients")]
    return "\n".join(lines)


def growth(samples: list[dict[str, Any]]) -> float:
    """Least-squares slope of the backlog over time, entries per second."""
    n = len(samples)
    if n < 2:
        return 0.0
    xs = [s["t"] for s in samples]
    ys = [s["backlog"] for s in samples]
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def sustained_plots(info: dict[str, Any], run: dict[str, Any]) -> None:
    samples = run["samples"]
    ts = [s["t"] for s in samples]
    backlog_series: dict[str, tuple[list[float], list[float]]] = {
        "Atlas journal backlog (entries committed)": (ts, [s["backlog"] for s in samples])
    }
    if info["subscription"]:
        backlog_series["subscription behind (changesets)"] = (ts, [s["behind"] for s in samples])
    plot(
        "http_sustained_backlog.png",
        backlog_series,
        title=f"Journal backlog during {run['seconds']:.0f} s of PUTs, {run['clients']} clients",
        xlabel="seconds",
        ylabel="entries",
        ymin0=True,
    )
    plot(
        "http_sustained_throughput.png",
        {"Atlas PUT/s": (ts, [s["puts"] for s in samples])},
        title=f"Atlas PUTs per second, {run['clients']} clients",
        xlabel="seconds",
        ylabel="successful PUTs in that second",
        ymin0=True,
    )


def sustained_section(info: dict[str, Any], run: dict[str, Any]) -> str:
    sustained_plots(info, run)
    samples = run["samples"]
    rate = run["throughput"]
    slope = growth(samples)
    flat = slope * run["seconds"] < rate
    end_ok = run["backlog_end"] < rate
    cpu = run["cpu_ms_per_put"]
    lines = [header(info["cmd"]), "", *processes(info), method(info), ""]
    lines += [
        f"Atlas only: {run['clients']} client threads for {run['seconds']:.0f} s, sampled once a"
        " second (successful PUTs in that second, journal backlog), then the drain.",
        "",
        table(
            ["PUTs", "PUT/s in run", "backlog at end", "max backlog", "growth entries/s"]
            + ["drain s", "PUT/s over run + drain", "errors"],
            [
                [
                    f"{run['requests']:,}",
                    rate,
                    f"{run['backlog_end']:,}",
                    f"{max((s['backlog'] for s in samples), default=0):,}",
                    f"{slope:.2f}",
                    run["drain_s"],
                    run["sustained"],
                    run["errors"],
                ]
            ],
        ),
        "",
        "CPU per successful PUT, ms (over run + drain): "
        + ", ".join(f"{CPU_LABELS[k]} {cpu[k]:.1f}" for k in CPU_COLUMNS)
        + f"; broker (Redis) {cpu['redis']:.1f}.",
        "",
        f"- flat backlog (fitted growth over the run < 1 s of writes): {verdict(flat)}"
        f" ({slope * run['seconds']:,.0f} entries vs {rate:.0f});",
        f"- backlog at the end < 1 s of writes: {verdict(end_ok)}.",
        "",
        image("http_sustained_backlog.png", "journal backlog over time"),
        "",
        image("http_sustained_throughput.png", "PUTs per second over time"),
    ]
    return "\n".join(lines)
