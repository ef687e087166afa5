"""``bench/planning.py --smoke`` runs end to end and reports each page's statements."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.reliability.harness import child_env, database_url_of_tests

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_the_planning_bench_runs_at_smoke_size(tmp_path):
    name = f"atlas_bench_planning_{uuid.uuid4().hex[:8]}"
    url = database_url_of_tests()
    doc, out = tmp_path / "benchmarks.md", tmp_path / "planning.json"
    env = child_env(
        url, ATLAS_BENCH_DB=name, ATLAS_BENCH_SERVER_URL=url, ATLAS_BENCH_PLOTS=str(tmp_path)
    )
    try:
        run = subprocess.run(
            [sys.executable, "bench/planning.py", "--smoke", "--doc", str(doc),
             "--json", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        admin = urlunsplit(urlsplit(url)._replace(path="/postgres"))
        with psycopg.connect(admin, autocommit=True) as conn:
            for db in (name, f"{name}_scale_2k"):
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    assert run.returncode == 0, run.stderr[-3000:]
    pages = json.loads(out.read_text())["2k"]["pages"]
    for page in pages.values():
        assert page["statements"] >= 1 and page["planning"] > 0 and page["execution"] > 0
    # A history page: its revisions, then their changesets by seq (rows.with_briefs).
    assert pages["history (busy entity)"]["statements"] == 2
    text = doc.read_text()
    assert "## Planning against running, page by page (issue 21, 2026-12-06)" in text
    assert "| feed from the start, scoped |" in text
