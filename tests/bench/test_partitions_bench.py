"""``bench/partitions.py --smoke`` runs end to end and reports what docs/benchmarks.md shows."""

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
def test_the_partitions_bench_runs_at_smoke_size(tmp_path):
    name = f"atlas_bench_partitions_{uuid.uuid4().hex[:8]}"
    url = database_url_of_tests()
    doc, out = tmp_path / "benchmarks.md", tmp_path / "partitions.json"
    env = child_env(url, ATLAS_BENCH_DB=name, ATLAS_BENCH_SERVER_URL=url)
    try:
        run = subprocess.run(
            [sys.executable, "bench/partitions.py", "--smoke", "--doc", str(doc),
             "--json", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        admin = urlunsplit(urlsplit(url)._replace(path="/postgres"))
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    delete, drop = result["removal_delete"], result["removal_drop"]
    assert delete["revisions"] == drop["revisions"] > 0  # the same cut both ways
    assert drop["bytes_after"] < drop["bytes_before"]  # a dropped partition returns its space
    # Both log tables' partitions go (migration 0038): what the drop leaves is less than
    # what the DELETE leaves (which returns nothing until VACUUM FULL).
    assert drop["bytes_after"] < delete["bytes_after"]
    assert set(result["reads_plain"]) == set(result["reads_partitioned"])
    text = doc.read_text()
    assert "## Log partitions: revisions and changesets (issue 21, migration 0038)" in text
    assert "--changesets 7900000" in text
