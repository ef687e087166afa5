"""``bench/archive.py --smoke`` runs end to end and reports what docs/benchmarks.md shows."""

from __future__ import annotations

import pytest

from tests.bench.smoke import run_smoke


@pytest.mark.django_db
def test_the_archive_bench_runs_at_smoke_size(tmp_path):
    result, text = run_smoke("archive", tmp_path)
    assert result["revisions"] == 1800 and result["segments"] >= 1  # 90% of 2,000 cut
    assert result["during_ms"]["n"] > 0 and result["alone_ms"]["n"] > 0
    assert result["changesets"] == 18  # batches of 100
    assert "## Archive cut (issue 21, phase 1)" in text and "| during the cut |" in text
