"""``bench/timestamps.py --smoke`` runs end to end: both loaders measured, one section written."""

from __future__ import annotations

import pytest

from tests.bench.smoke import run_smoke


@pytest.mark.django_db
def test_the_timestamps_bench_compares_both_loaders_at_smoke_size(tmp_path):
    result, text = run_smoke("timestamps", tmp_path)
    medians = result["medians_ms"]
    assert set(medians) == {"django", "fast"}
    assert set(medians["django"]) == set(medians["fast"])
    assert "50-op batch (its locked rows)" in medians["fast"]
    assert all(ms > 0 for found in medians.values() for ms in found.values())
    assert "## Timestamps through psycopg's C loader" in text
    assert "| entity list page (500 entities) |" in text
