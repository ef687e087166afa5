"""``bench/_common.py``: the bulk-load helper rebuilds what it dropped, on every
partition; the part scripts' command line hands ``--doc`` and ``--plots`` to children."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.db import connection

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _common import (  # noqa: E402 (bench/ is not a package on the path)
    drop_secondary,
    parse_part_args,
    part_parser,
)


def _indexes_per_partition() -> dict[str, set[str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, i.indexrelid::regclass::text, i.indisvalid FROM pg_inherits h"
            " JOIN pg_class c ON c.oid = h.inhrelid JOIN pg_index i ON i.indrelid = c.oid"
            " WHERE h.inhparent = 'changesets_revision'::regclass"
        )
        out: dict[str, set[str]] = {}
        for partition, index, valid in cursor.fetchall():
            assert valid, index
            out.setdefault(partition, set()).add(index)
    return out


@pytest.mark.django_db
def test_drop_secondary_rebuilds_every_partitions_indexes_of_the_revision_table():
    before = _indexes_per_partition()
    assert before and all(len(indexes) > 2 for indexes in before.values())
    with connection.cursor() as cursor:
        recreate = drop_secondary(cursor, "changesets_revision")
        assert all(len(indexes) <= 2 for indexes in _indexes_per_partition().values())
        for statement in recreate:
            cursor.execute(statement)
        cursor.execute(
            "SELECT count(*) FROM pg_index WHERE indrelid = 'changesets_revision'::regclass"
            " AND NOT indisvalid"
        )
        assert cursor.fetchone()[0] == 0  # no parent index left without its partitions'
    assert {p: len(i) for p, i in _indexes_per_partition().items()} == {
        p: len(i) for p, i in before.items()
    }


def test_doc_and_plots_reach_children_as_absolute_paths(monkeypatch, tmp_path):
    """A child that runs elsewhere (or after a chdir) must name the same files."""
    monkeypatch.chdir(tmp_path)
    # Set, so that monkeypatch puts back what was there (parse_part_args writes them).
    monkeypatch.setenv("ATLAS_BENCH_DOC", "")
    monkeypatch.setenv("ATLAS_BENCH_PLOTS", "")
    parser = part_parser(None, plots_option=True)
    args = parse_part_args(parser, ["--doc", "out.md", "--plots", "pngs"])
    assert (args.doc, args.plots) == ("out.md", "pngs")
    import os

    assert os.environ["ATLAS_BENCH_DOC"] == str(tmp_path / "out.md")
    assert os.environ["ATLAS_BENCH_PLOTS"] == str(tmp_path / "pngs")
    # A script that draws nothing takes no --plots.
    with pytest.raises(SystemExit):
        parse_part_args(part_parser(None), ["--plots", "pngs"])
