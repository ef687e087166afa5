"""The read benchmarks' own machinery (bench/_sqltime.py, bench/_scale_measure.py,
bench/_scale_report.py, bench/_keys_report.py): what they time, count and conclude.

bench/scale.py and bench/keys_blame_diff.py are only honest if the SQL time they
report is the statements' (not Django's millisecond-rounded log), if the plan
they show is of the statement as it ran (its parameters), if "blocks read"
counts reads from outside shared buffers, if the rows a page shows are counted
right (a page that shows more rows at a larger size is not a regression), and if
a row over 1.3× is attributed to what changed. The end-to-end keys run is in
tests/bench/test_bench_smoke.py.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from django.db import connection

from tests.bench.smoke import drop_databases, unique_name

ROOT = Path(__file__).resolve().parents[2]


def bench_module(name: str) -> ModuleType:
    """A bench helper, imported as the scripts import it (bench/ on the path)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    return importlib.import_module(name)


@pytest.mark.django_db
def test_sql_timer_keeps_each_statement_with_its_parameters_and_time():
    sqltime = bench_module("_sqltime")
    with sqltime.sql_timer() as timer, connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.02), %s::int", [7])
        cursor.execute("SELECT 1")
    assert [s.params for s in timer.statements] == [[7], None]
    assert timer.statements[0].ms >= 20  # a millisecond-rounded log could not say 0.3 ms
    assert 0 < timer.statements[1].ms < timer.statements[0].ms
    assert timer.slowest() is timer.statements[0]
    assert timer.ms == pytest.approx(sum(s.ms for s in timer.statements))


@pytest.mark.django_db
def test_explain_reruns_the_statement_with_its_parameters_and_never_a_write():
    sqltime = bench_module("_sqltime")
    with sqltime.sql_timer() as timer, connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relname = %s", ["pg_class"])
    plan = sqltime.explain(timer.statements[0])
    assert "Buffers:" in plan and "pg_class" in plan and "actual time" in plan
    write = sqltime.Statement("UPDATE auth_user SET username = 'x'", None, 1.0)
    assert sqltime.explain(write).startswith("(a write, not re-run)")
    assert sqltime.explain(None) == ""


@pytest.mark.django_db(transaction=True)
def test_buffer_counts_see_this_sessions_own_reads_at_once():
    """Outside a transaction, as the benchmark's requests run: the counts include the
    statement just run (forced flush), not a second later."""
    sqltime = bench_module("_sqltime")
    hit0, read0 = sqltime.buffer_counts()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_attribute")
    hit1, read1 = sqltime.buffer_counts()
    assert (hit1 + read1) - (hit0 + read0) > 0


def test_rows_shown_counts_api_results_and_admin_rows_not_detail_pages():
    measure = bench_module("_scale_measure")
    api = json.dumps({"results": [{}, {}, {}], "next_page_token": None}).encode()
    assert measure.rows_shown("application/json", api) == 3
    assert measure.rows_shown("application/json", b'{"id": "x"}') is None
    html = (
        '<table id="result_list"><thead><tr><th>a</th></tr></thead>'
        "<tbody><tr><td>1</td></tr><tr><td>2</td></tr></tbody></table><tr>outside</tr>"
    )
    assert measure.rows_shown("text/html", html.encode()) == 2
    assert measure.rows_shown("text/html", b"<html>a changeset's page</html>") is None


def row(p50: float, sql: float, rows: int | None, read: float = 0) -> dict:
    return {"p50": p50, "sql_ms": sql, "rows": rows, "buffers_read": read, "status": 200}


def test_why_names_what_grew_and_calls_the_rest_noise():
    report = bench_module("_scale_report")
    two = [100_000, 10_000_000]
    assert report.why([row(10, 1, 6), row(30, 1.2, 50)], two) == "shows 6 → 50 rows"
    assert report.why([row(10, 1, 50), row(30, 9, 50)], two) == "SQL 1.0 → 9.0 ms"
    reads = report.why([row(10, 1, 50), row(30, 1.5, 50, read=120)], two)
    assert reads == "reads 120 blocks outside shared buffers"
    quiet = "same rows, SQL flat, few blocks read: noise"
    assert report.why([row(10, 1, 50), row(30, 1.4, 50)], two) == quiet
    assert report.why([row(10, 1, 50), row(30, 1.4, 50, read=3)], two) == quiet  # 3 blocks: µs


def test_why_gives_a_page_that_shows_more_rows_its_growth_at_equal_rows():
    report = bench_module("_scale_report")
    three = [100_000, 1_000_000, 10_000_000]
    grew = [row(10, 1, 6), row(20, 1.1, 50), row(22, 1.2, 50)]
    assert report.why(grew, three) == "shows 6 → 50 rows, 1.10× from 1M at 50 rows"
    # No middle size with the largest size's rows: nothing to compare at equal rows.
    still = [row(10, 1, 6), row(20, 1.1, 20), row(30, 1.2, 50)]
    assert report.why(still, three) == "shows 6 → 50 rows"


def test_warm_table_counts_the_rows_over_the_bound_and_their_reasons():
    report = bench_module("_scale_report")
    sizes = [100_000, 10_000_000]
    flat = {**row(10, 1, 50), "http_p50": 12.0}
    cells = {
        ("flat page", "superuser"): {sizes[0]: flat, sizes[1]: {**flat, "p50": 12.0}},
        ("fuller page", "scoped"): {
            sizes[0]: {**row(10, 1, 6), "http_p50": 12.0},
            sizes[1]: {**row(25, 1, 50), "http_p50": 14.0},
        },
        ("slower over http", "scoped"): {
            sizes[0]: flat,
            sizes[1]: {**flat, "http_p50": 30.0},
        },
    }
    lines = report.warm_table(cells, sizes)
    assert lines[0].startswith("2 of 3 page × user rows grew more than 1.3×")
    assert "1 more rows shown" in lines[0] and "1 noise" in lines[0]
    fuller = next(line for line in lines if line.startswith("| fuller page |"))
    assert "**2.50**" in fuller and "6 / 50" in fuller and fuller.endswith("shows 6 → 50 rows |")


def test_keys_verdict_flags_only_targeted_requests_over_the_bound():
    keys = bench_module("_keys_report")

    def size(total: int, blame: float, diff: float) -> dict:
        return {"total": total, "results": {"blame (x)": {"p50": blame}, "/diff x": {"p50": diff}}}

    flat = [size(10_000, 10.0, 100.0), size(1_000_000, 12.0, 900.0)]
    assert keys.verdicts(flat, [10_000, 1_000_000], ["blame (x)", "/diff x"]).startswith(
        "**Target met**"
    )
    grown = [size(10_000, 10.0, 100.0), size(1_000_000, 14.0, 100.0)]
    text = keys.verdicts(grown, [10_000, 1_000_000], ["blame (x)", "/diff x"])
    assert text.startswith("**Over 1.3×") and "blame (x) (1.40×)" in text and "/diff" not in text


@pytest.mark.django_db
def test_slowest_plan_picks_the_statement_slow_by_its_plan_not_by_one_sample():
    sqltime = bench_module("_sqltime")
    quick = sqltime.Statement("SELECT 1", None, 50.0)  # a hiccup made this sample slow
    slow = sqltime.Statement("SELECT pg_sleep(0.03)", None, 31.0)
    write = sqltime.Statement("DELETE FROM auth_user WHERE false", None, 99.0)
    statement, plan = sqltime.slowest_plan([quick, slow, write])
    assert statement is slow
    assert sqltime.execution_ms(plan) >= 30
    assert sqltime.slowest_plan([write]) == (None, "")


@pytest.mark.slow
def test_scale_bench_times_two_sizes_interleaved_in_process_and_over_gunicorn(tmp_path):
    """bench/scale.py end to end at two tiny sizes, a few pages: a server per size,
    gunicorn per size, the saved records and the report's table."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    name = unique_name("check")  # its sizes are <name>_scale_2k and <name>_scale_10k
    env.update(
        ATLAS_BENCH_DB=name,
        ATLAS_BENCH_PLOTS=str(tmp_path),
        ATLAS_BENCH_DOC=str(tmp_path / "benchmarks.md"),
    )
    script = [sys.executable, str(ROOT / "bench" / "scale.py")]
    run = script + ["--sizes", "2k,10k", "--only", "author=tiny", "--runs", "2"]
    try:
        _scale_two_sizes(script, run, env, tmp_path)
    finally:
        drop_databases(prefix=name)


def _scale_two_sizes(script: list[str], run: list[str], env: dict, tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for size, total in (("2k", 2_000), ("10k", 10_000)):
        data = json.loads((tmp_path / f"scale-{size}-warm.json").read_text())
        assert data["size"] == total and data["interleaved_with"] == [2_000, 10_000]
        pages = {(r["user"], r["page"]): r for r in data["results"]}
        assert set(pages) == {
            (user, page)
            for user in ("superuser", "scoped")
            for page in ("api changesets author=tiny", "admin changelist author=tiny")
        }
        for r in pages.values():
            assert r["status"] == 200 and r["http_status"] == 200
            assert len(r["samples"]) == len(r["http_samples"]) == 2
            assert r["sql_ms"] > 0 and r["queries"] > 0 and "Buffers:" in r["plan"]
        api = pages[("superuser", "api changesets author=tiny")]
        assert api["render_ms"] > 0 and api["rows"] is not None
    report = subprocess.run(script + ["--report"], cwd=ROOT, env=env, timeout=120, check=False)
    assert report.returncode == 0
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "### warm" in doc and "| admin changelist author=tiny | scoped |" in doc
