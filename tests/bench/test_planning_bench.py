"""``bench/planning.py --smoke`` runs end to end and reports each page's statements."""

from __future__ import annotations

import pytest

from tests.bench.smoke import run_smoke


@pytest.mark.django_db
def test_the_planning_bench_runs_at_smoke_size(tmp_path):
    result, text = run_smoke(
        "planning",
        tmp_path,
        extra_databases=("_scale_2k",),
        env={"ATLAS_BENCH_PLOTS": str(tmp_path)},
    )
    pages = result["2k"]["pages"]
    for page in pages.values():
        assert page["statements"] >= 1 and page["planning"] > 0 and page["execution"] > 0
    # A history page: its revisions, then their changesets by seq (rows.with_briefs).
    assert pages["history (busy entity)"]["statements"] == 2
    assert "## Planning against running, page by page (issue 21, 2026-12-06)" in text
    assert "| feed from the start, scoped |" in text
