"""``bench/_bytes_growth.py`` counts what a write adds to every partition, index and TOAST table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.db import connection

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _bytes_growth import footprint, growth_per_write  # noqa: E402 (bench/ is not a package)

pytestmark = pytest.mark.django_db


@pytest.fixture
def scratch():
    """A table partitioned in two, with an index, whose rows TOAST when large."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE growth_scratch (n int, body text) PARTITION BY RANGE (n);"
            " CREATE TABLE growth_scratch_a PARTITION OF growth_scratch"
            " FOR VALUES FROM (0) TO (1000);"
            " CREATE TABLE growth_scratch_b PARTITION OF growth_scratch"
            " FOR VALUES FROM (1000) TO (2000);"
            " CREATE INDEX growth_scratch_n ON growth_scratch (n);"
            " ALTER TABLE growth_scratch_b ALTER COLUMN body SET STORAGE EXTERNAL"
        )
    yield "growth_scratch"
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE growth_scratch")


def _insert(n: int, body: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO growth_scratch VALUES (%s, %s)", [n, body])


def test_footprint_counts_every_partition_its_indexes_and_toast(scratch):
    with connection.cursor() as cursor:
        empty = footprint(cursor, [scratch])
        _insert(1500, "x" * 100_000)  # partition b, stored out of line uncompressed
        toasted = footprint(cursor, [scratch])
        assert toasted - empty >= 100_000  # the TOAST chunks, not the row's pointer
        for n in range(200):
            _insert(n, "y" * 500)  # partition a: its heap pages and its index's
        cursor.execute("SELECT pg_relation_size('growth_scratch_a')")
        heap_a = cursor.fetchone()[0]
        grown = footprint(cursor, [scratch]) - toasted
        assert heap_a >= 200 * 500 and grown > heap_a  # the index's pages too


def test_growth_per_write_is_the_growth_over_the_writes(scratch):
    per_write = growth_per_write(connection, [scratch], lambda i: _insert(i, "z" * 800), 400)
    # 400 rows of ~830 bytes: 9 to a page, and an index entry each.
    assert 800 < per_write < 1100, per_write
