"""Chain hashes are stored as 32 bytes and shown as the same hex text everywhere (0027)."""

from __future__ import annotations

import hashlib
import io

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from changesets import chain
from changesets.fields import ChainHashField
from changesets.models import Changeset, LogHead
from changesets.selectors.log import previous_hash
from tests.changesets.test_chain import _disable_guards, verify

pytestmark = pytest.mark.django_db
NS = "acme.orders"


@pytest.fixture
def log(staff, namespace, write) -> list[Changeset]:
    for i in range(6):
        write(staff, f"{NS}/order/o{i % 3}", {"i": i, "note": "é" * i})
    write(staff, f"{NS}/order/o1", None)
    return list(Changeset.objects.order_by("seq"))


def stored(table: str, where: str = "TRUE") -> list[tuple]:
    """Each row's hash columns as the table holds them: (type, bytes, hex of the bytes)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT pg_typeof(hash)::text, octet_length(hash), encode(hash, 'hex'),"
            f" octet_length(prev_hash), encode(prev_hash, 'hex')"
            f" FROM {table} WHERE {where} ORDER BY 3"
        )
        return cursor.fetchall()


def test_a_hash_is_stored_as_its_32_bytes(log):
    rows = stored("changesets_changeset")
    assert len(rows) == len(log)
    for kind, size, _, prev_size, _ in rows:
        # No prev_hash stored since migration 0034: it is the previous row's hash.
        assert (kind, size, prev_size) == ("bytea", 32, None)
    (head,) = stored("changesets_loghead")
    assert head[:2] == ("bytea", 32) and head[3] == 32
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM changesets_changeset WHERE v1_hash IS NOT NULL")
        assert cursor.fetchone()[0] == 0  # NULL on every changeset written since the re-chain


def test_the_model_reads_the_hex_the_table_holds_as_bytes(log):
    hexes = {row[2] for row in stored("changesets_changeset")}
    for changeset in log:
        assert changeset.hash in hexes and changeset.prev_hash is None
        assert len(changeset.hash) == 64 and changeset.hash == changeset.hash.lower()
    assert previous_hash(log[0]) == chain.GENESIS  # 32 zero bytes, shown as 64 zeros
    assert [previous_hash(c) for c in log[1:]] == [c.hash for c in log[:-1]]
    head = LogHead.objects.get(pk=1)
    assert (head.hash, head.prev_hash) == (log[-1].hash, log[-2].hash)
    # Lookups and values take and give the hex too.
    assert Changeset.objects.get(hash=log[3].hash) == log[3]
    assert list(Changeset.objects.order_by("seq").values_list("hash", flat=True)) == [
        c.hash for c in log
    ]


def test_the_write_returns_the_hash_it_stored(staff, namespace, write):
    result = write(staff, f"{NS}/order/a", {"n": 1})
    assert previous_hash(result.changeset) == chain.GENESIS
    row = Changeset.objects.get(pk=result.changeset.pk)
    assert (row.hash, row.prev_hash) == (result.changeset.hash, result.changeset.prev_hash)
    assert isinstance(result.changeset.hash, str)


def test_every_surface_shows_the_same_hex(log, staff, client, client_for):
    newest = log[-1]
    body = client_for(staff).get("/api/v1/log/head").json()
    assert (body["seq"], body["hash"]) == (newest.seq, newest.hash)
    out = io.StringIO()
    call_command("verify_log", "--no-progress", stdout=out)
    assert f"head seq {newest.seq} hash {newest.hash};" in out.getvalue()
    client.force_login(staff)
    page = client.get(f"/admin/changesets/changeset/{newest.pk}/change/").content.decode()
    assert f'title="previous: {log[-2].hash}">{newest.hash}</code>' in page


def test_an_empty_log_has_no_head_hash_and_publishes_the_genesis(staff, client_for):
    LogHead.objects.update_or_create(pk=1, defaults={"seq": 0, "hash": None, "prev_hash": None})
    assert stored("changesets_loghead")[0][1] is None  # NULL, not an empty string
    assert client_for(staff).get("/api/v1/log/head").json()["hash"] == chain.GENESIS


def test_an_empty_string_still_means_no_hash():
    field = ChainHashField(null=True)
    assert field.get_prep_value("") is None and field.get_prep_value(None) is None
    assert field.get_prep_value(chain.GENESIS) == bytes(32)
    assert field.from_db_value(memoryview(b"\x01" * 32), None, connection) == "01" * 32
    assert field.to_python("AB" * 32) == "ab" * 32


def _edit(sql: str, params: list) -> chain.Break | None:
    sid = transaction.savepoint()
    with connection.cursor() as cursor:
        _disable_guards(cursor)
        cursor.execute(sql, params)
    broken = verify()
    transaction.savepoint_rollback(sid)
    return broken


def test_an_edited_stored_hash_is_caught(log):
    other = hashlib.sha256(b"forged").digest()
    middle = log[3]
    edits = {
        "hash replaced": ("UPDATE changesets_changeset SET hash = %s WHERE seq = %s", [other]),
        "hash removed": ("UPDATE changesets_changeset SET hash = NULL WHERE seq = %s", []),
        "prev_hash replaced": (
            "UPDATE changesets_changeset SET prev_hash = %s WHERE seq = %s",
            [other],
        ),
        # (A NULL prev_hash is every row's since migration 0034: the previous hash.)
        "one bit flipped": (
            "UPDATE changesets_changeset SET hash = set_bit(hash, 0, 1 - get_bit(hash, 0))"
            " WHERE seq = %s",
            [],
        ),
    }
    for what, (sql, params) in edits.items():
        broken = _edit(sql, [*params, middle.seq])
        assert broken is not None and broken.seq in (middle.seq, middle.seq + 1), what
    head_edit = _edit("UPDATE changesets_loghead SET hash = %s WHERE id = 1", [other])
    assert head_edit is not None and "log head" in head_edit.reason
    assert verify() is None
