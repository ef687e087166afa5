"""``bench/renderers.py --smoke`` runs end to end: both renderers timed, the same bytes."""

from __future__ import annotations

import pytest

from tests.bench.smoke import run_smoke


@pytest.mark.django_db
def test_the_renderers_bench_times_both_and_finds_the_same_bytes(tmp_path):
    result, text = run_smoke("renderers", tmp_path)
    pages = result["pages"]
    assert len(pages) == 3
    for page in pages.values():
        assert page["same_bytes"] is True
        assert page["bytes"] > 0 and page["drf"] > 0 and page["orjson"] > 0
    assert "## API pages encoded by orjson" in text
