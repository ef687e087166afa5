"""``bench/log_bytes.py --smoke`` runs end to end and accounts for every byte it reports."""

from __future__ import annotations

import pytest

from tests.bench.smoke import run_smoke


@pytest.mark.django_db
def test_the_log_bytes_bench_runs_at_smoke_size(tmp_path):
    result, text = run_smoke("log_bytes", tmp_path)
    measured = result["measured"]
    small, large = measured["revision, 150 B document"], measured["revision, 2 KB document"]
    assert small["rows"] == large["rows"] == 300
    assert large["row"] > small["row"]  # the 2 KB document is not compressed away
    # The columns add up to the row (less the tuple header and alignment).
    columns = sum(size for _, size in small["columns"])
    assert columns < small["row"] < columns + 64
    indexes = dict(measured["changesets_revision"]["indexes"])
    assert indexes and all(size > 0 for size in indexes.values())
    assert "## Where a write's bytes go (issue 16, item 6)" in text
