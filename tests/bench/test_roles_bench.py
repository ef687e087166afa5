"""``bench/roles.py --smoke`` runs end to end: both statements timed, with and without
statistics, for each grant count."""

from __future__ import annotations

import pytest

from tests.bench.smoke import run_smoke


@pytest.mark.django_db
def test_the_roles_bench_times_the_role_load_and_the_lock_statement(tmp_path):
    result, text = run_smoke("roles", tmp_path, extra_databases=("_roles",))
    rows = result["rows"]
    seen = {(r["statement"], r["grants"], r["statistics"]) for r in rows}
    assert len(seen) == len(rows) == 8  # 2 statements x 2 grant counts x 2 states
    assert {r["grants"] for r in rows} == {3, 500}
    assert all(r["wall_ms"] > 0 for r in rows)
    assert "## Role rows: authorization per request and per write" in text
