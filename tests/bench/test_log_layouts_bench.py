"""``bench/log_layouts.py --smoke`` runs end to end: every layout holds every write, and
the one-row layout is smaller than today's for both callers."""

from __future__ import annotations

import pytest

from tests.bench.smoke import run_smoke

LAYOUTS = ("today", "one row", "no revision id", "provenance as columns")


@pytest.mark.django_db
def test_the_log_layouts_bench_builds_every_layout_from_every_write(tmp_path):
    result, text = run_smoke("log_layouts", tmp_path, extra_databases=("_layouts",))
    for caller in ("service", "http"):
        # The revision table's copy (today) and the merged row hold one row a write.
        assert result["rows"][caller] == dict.fromkeys(LAYOUTS, 200)
        sizes = result["measured"][caller]
        assert set(sizes) == set(LAYOUTS)
        assert sizes["one row"] < sizes["today"]
        assert sizes["no revision id"] < sizes["one row"]
    # An HTTP write's provenance is what makes it bigger than a service write.
    assert result["measured"]["http"]["today"] > result["measured"]["service"]["today"]
    assert "## Other layouts of the log, on the same rows (issue 16, item 6)" in text
