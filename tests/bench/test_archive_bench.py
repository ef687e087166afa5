"""``bench/archive.py --smoke`` runs end to end and reports what docs/benchmarks.md shows."""

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
def test_the_archive_bench_runs_at_smoke_size(tmp_path):
    name = f"atlas_bench_archive_{uuid.uuid4().hex[:8]}"
    url = database_url_of_tests()
    doc, out = tmp_path / "benchmarks.md", tmp_path / "archive.json"
    env = child_env(url, ATLAS_BENCH_DB=name, ATLAS_BENCH_SERVER_URL=url)
    try:
        run = subprocess.run(
            [sys.executable, "bench/archive.py", "--smoke", "--doc", str(doc), "--json", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        # The path, not the last "/": the embedded server's URL names its socket folder
        # in the query (?host=/…/.atlas/pgdata).
        admin = urlunsplit(urlsplit(url)._replace(path="/postgres"))
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["revisions"] == 1800 and result["segments"] >= 1  # 90% of 2,000 cut
    assert result["during_ms"]["n"] > 0 and result["alone_ms"]["n"] > 0
    assert result["changesets"] == 18  # batches of 100
    text = doc.read_text()
    assert "## Archive cut (issue 21, phase 1)" in text and "| during the cut |" in text
