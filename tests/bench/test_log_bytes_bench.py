"""``bench/log_bytes.py --smoke`` runs end to end and accounts for every byte it reports."""

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
def test_the_log_bytes_bench_runs_at_smoke_size(tmp_path):
    name = f"atlas_bench_bytes_{uuid.uuid4().hex[:8]}"
    url = database_url_of_tests()
    doc, out = tmp_path / "benchmarks.md", tmp_path / "bytes.json"
    env = child_env(url, ATLAS_BENCH_DB=name, ATLAS_BENCH_SERVER_URL=url)
    try:
        run = subprocess.run(
            [sys.executable, "bench/log_bytes.py", "--smoke", "--doc", str(doc),
             "--json", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        admin = urlunsplit(urlsplit(url)._replace(path="/postgres"))
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert run.returncode == 0, run.stderr[-3000:]
    measured = json.loads(out.read_text())["measured"]
    small, large = measured["revision, 150 B document"], measured["revision, 2 KB document"]
    assert small["rows"] == large["rows"] == 300
    assert large["row"] > small["row"]  # the 2 KB document is not compressed away
    # The columns add up to the row (less the tuple header and alignment).
    columns = sum(size for _, size in small["columns"])
    assert columns < small["row"] < columns + 64
    indexes = dict(measured["changesets_revision"]["indexes"])
    assert indexes and all(size > 0 for size in indexes.values())
    text = doc.read_text()
    assert "## Where a write's bytes go (issue 16, item 6)" in text
