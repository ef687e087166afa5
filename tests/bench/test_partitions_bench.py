"""``bench/partitions.py --smoke`` runs end to end and reports what docs/benchmarks.md shows."""

from __future__ import annotations

import pytest

from tests.bench.smoke import run_smoke


@pytest.mark.django_db
def test_the_partitions_bench_runs_at_smoke_size(tmp_path):
    result, text = run_smoke("partitions", tmp_path)
    delete, drop = result["removal_delete"], result["removal_drop"]
    assert delete["revisions"] == drop["revisions"] > 0  # the same cut both ways
    assert drop["bytes_after"] < drop["bytes_before"]  # a dropped partition returns its space
    # Both log tables' partitions go (migration 0038): what the drop leaves is less than
    # what the DELETE leaves (which returns nothing until VACUUM FULL).
    assert drop["bytes_after"] < delete["bytes_after"]
    assert set(result["reads_plain"]) == set(result["reads_partitioned"])
    assert "## Log partitions: revisions and changesets (issue 21, migration 0038)" in text
    assert "--changesets 7900000" in text
