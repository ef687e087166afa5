"""``load_archive``: archived history back in PostgreSQL, verified, in a schema of its own.

The round trip: what a full export showed before the cut is what the loaded
rows show after it (the export lines rebuilt from them, the chain hashes and
salts), loading twice changes nothing, and a segment that does not verify
loads nothing.
"""

from __future__ import annotations

import gzip
import json
from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from changesets import ndjson
from changesets.archive.models import ArchiveSegment
from changesets.models import Changeset
from tests.changesets.archive.conftest import cut, full_export

pytestmark = pytest.mark.django_db


def _rows(schema: str, sql: str) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(sql.format(s=schema))
        names = [c.name for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _loaded(schema: str) -> dict[str, dict]:
    """Per changeset id: its export lines rebuilt from the loaded rows, hashes and salts."""
    out = {}
    for c in _rows(schema, "SELECT * FROM {s}.changeset ORDER BY seq"):
        revisions = _rows(schema, f"SELECT * FROM {{s}}.revision WHERE changeset_id = '{c['id']}'"
                                  " ORDER BY position")  # fmt: skip
        for r in revisions:
            for name in ("before", "after", "sealed"):
                r[name] = json.loads(r[name]) if isinstance(r[name], str) else r[name]
        changeset = SimpleNamespace(**c)
        changeset.metadata = (
            json.loads(c["metadata"]) if isinstance(c["metadata"], str) else c["metadata"]
        )
        changeset.context = (
            json.loads(c["context"]) if isinstance(c["context"], str) else c["context"]
        )
        lines = list(ndjson.export_lines(changeset, [SimpleNamespace(**r) for r in revisions]))
        out[str(c["id"])] = {
            "lines": lines,
            "seq": c["seq"],
            "hash": c["hash"],
            "prev_hash": c["prev_hash"],
            "salts": [None if r["salt"] is None else bytes(r["salt"]).hex() for r in revisions],
            "sealed": [r["sealed"] for r in revisions],
        }
    return out


def test_a_loaded_archive_is_the_export_taken_before_the_cut(seed, archive_dir):
    seeded = seed(3)
    target = seeded.seq_of(9)
    export = full_export()
    cut(target + 1)
    out = StringIO()
    call_command("load_archive", "--all", "--schema", "inquiry", stdout=out)
    assert "verified" in out.getvalue()
    expected = {cid: row for cid, row in export.items() if row["seq"] <= target}
    assert _loaded("inquiry") == expected

    call_command("load_archive", "--all", "--schema", "inquiry", stdout=StringIO())
    assert len(_loaded("inquiry")) == len(expected)  # loading twice changes nothing
    assert Changeset.objects.filter(seq__lte=target).count() == 0  # never the live tables


def test_one_segment_loads_alone(seed, archive_dir):
    seeded = seed(2)
    cut(seeded.seq_of(5) + 1)
    first = ArchiveSegment.objects.order_by("first_seq").first()
    call_command("load_archive", first.name, "--schema", "one", stdout=StringIO())
    seqs = [r["seq"] for r in _rows("one", "SELECT seq FROM {s}.changeset ORDER BY seq")]
    assert seqs == list(range(first.first_seq, first.last_seq + 1))


def test_a_segment_that_does_not_verify_loads_nothing(seed, archive_dir):
    seeded = seed(2)
    cut(seeded.seq_of(5) + 1)
    first = ArchiveSegment.objects.order_by("first_seq").first()
    path = archive_dir / first.name
    text = gzip.decompress(path.read_bytes()).decode().replace('"title"', '"tltle"')
    path.write_bytes(gzip.compress(text.encode(), mtime=0))
    with pytest.raises(CommandError, match="not the file its checkpoint signs"):
        call_command("load_archive", first.name, "--schema", "bad", stdout=StringIO())
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = 'bad'")
        assert cursor.fetchone() is None


@pytest.mark.parametrize("schema", ["public", "pg_temp", "Bad-Name", "x; drop table"])
def test_only_a_schema_of_its_own_is_loaded_into(seed, archive_dir, schema):
    seeded = seed(1)
    cut(seeded.seq_of(2) + 1)
    with pytest.raises(CommandError, match="not a schema name"):
        call_command("load_archive", "--all", "--schema", schema, stdout=StringIO())
