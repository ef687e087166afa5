"""The tamper-evident log: every edit or deletion of a log row is detected."""

from __future__ import annotations

import io
import random

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from changesets import chain
from changesets.chain.encoding import _canonical, _timestamp
from changesets.chain.header import _header_rest
from changesets.models import Changeset, LogHead, Revision, Rpc
from changesets.ops import DeleteOp, PutOp
from changesets.selectors.log import previous_hash
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline

pytestmark = pytest.mark.django_db
NS = "acme.orders"


def verify() -> chain.Break | None:
    def pairs():
        for changeset in Changeset.objects.order_by("seq"):
            yield changeset, list(Revision.objects.filter(changeset=changeset).order_by("id"))

    return chain.verify(pairs(), head=LogHead.objects.get(pk=1))[1]


@pytest.fixture
def history(staff, namespace):
    rng = random.Random(7)
    for i in range(30):
        ops = []
        for slug in rng.sample(["a", "b", "c", "d", "e"], rng.randint(1, 3)):
            key = EntityKey(NS, "order", slug)
            exists = baseline.get(key) is not None
            if exists and rng.random() < 0.25:
                ops.append(DeleteOp(key))
            else:
                ops.append(PutOp(key, {"i": i, "slug": slug, "f": rng.random()}))
        changeset_apply(store=baseline, actor=staff, ops=ops, rpc=Rpc.BATCH_MUTATE)
    return Changeset.objects.count()


def test_every_changeset_chains_to_the_previous_one(history):
    """Each hash covers the one before it; a row stores no prev_hash (migration 0034:
    it is the previous row's hash), and ``previous_hash`` finds it."""
    rows = list(Changeset.objects.order_by("seq"))
    assert {row.prev_hash for row in rows} == {None}
    assert previous_hash(rows[0]) == chain.GENESIS
    for before, after in zip(rows, rows[1:], strict=False):
        assert previous_hash(after) == before.hash
    assert LogHead.objects.get(pk=1).hash == rows[-1].hash
    assert verify() is None


@pytest.mark.parametrize(
    "comment",
    ["", 'quote " backslash \\ slash /', "new\nline\ttab\x01\x1f", "é ü ß 漢字 😀 \u2028\u2029"],
)
def test_the_hash_postgresql_computes_is_the_one_verify_recomputes(staff, namespace, comment):
    """The write path has PostgreSQL hash the header (``chain.hash_sql``) around the
    seq and time it draws; ``verify`` hashes it in Python. Any byte of difference (a
    JSON escape, the timestamp's form) would make every changeset fail verification."""
    staff.username = 'röot "ü" 😀'
    staff.save()
    key = EntityKey(NS, "order", "a")
    written = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(key, {"text": comment, "n": 1.5}), PutOp(EntityKey(NS, "o", "b"), {})],
        rpc=Rpc.BATCH_MUTATE,
        comment=comment,
    ).changeset
    row = Changeset.objects.get(pk=written.pk)
    revisions = list(Revision.objects.filter(changeset=row).order_by("id"))
    expected = chain.changeset_hash(
        prev_hash=previous_hash(row), changeset=row, revisions_hex=chain.revisions_digest(revisions)
    )
    assert row.hash == written.hash == expected
    assert (written.seq, written.at, written.prev_hash) == (row.seq, row.at, row.prev_hash)
    assert LogHead.objects.get(pk=1).hash == row.hash
    assert verify() is None


def test_the_sql_header_is_the_python_header_byte_for_byte(staff, namespace):
    """``header_middle`` spliced between ``at`` and ``seq`` is the canonical header."""
    written = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(EntityKey(NS, "order", "a"), {"n": 1})],
        rpc=Rpc.PUT_ENTITY,
        comment="x",
    ).changeset
    middle = chain.header_middle(written, "d" * 64)
    spliced = f'{{"at":"{_timestamp(written.at)}",{middle},"seq":{written.seq}}}'.encode()
    header = {
        **_header_rest(written, "d" * 64),
        "at": _timestamp(written.at),
        "seq": written.seq,
    }
    assert spliced == _canonical(header)


def test_verify_log_command_passes_on_an_untouched_log(history):
    out = io.StringIO()
    call_command("verify_log", "--no-progress", stdout=out)
    assert f"{history} changeset(s) verified" in out.getvalue()


def test_log_head_endpoint_publishes_seq_and_hash(history, staff, client_for):
    body = client_for(staff).get("/api/v1/log/head").json()
    head = LogHead.objects.get(pk=1)
    assert body["seq"] == head.seq == history
    assert body["hash"] == head.hash
    assert body["at"].endswith("Z")


def _disable_guards(cursor) -> None:
    """What an attacker with the table owner's rights would do first."""
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE needs no pending FK checks
    cursor.execute("ALTER TABLE changesets_changeset DISABLE TRIGGER changeset_append_only")
    cursor.execute("ALTER TABLE changesets_revision DISABLE TRIGGER revision_append_only")
    # DELETE has its own trigger since the archive (migration 0024).
    cursor.execute("ALTER TABLE changesets_changeset DISABLE TRIGGER changeset_delete_guard")
    cursor.execute("ALTER TABLE changesets_revision DISABLE TRIGGER revision_delete_guard")


def _tamper(rng: random.Random) -> str:
    """One random single-row edit or deletion in the changeset or revision table."""
    with connection.cursor() as cursor:
        _disable_guards(cursor)
        choice = rng.randrange(10)
        if choice == 0:
            cursor.execute(
                "UPDATE changesets_changeset SET author_name = 'mallory'"
                " WHERE id = (SELECT id FROM changesets_changeset ORDER BY random() LIMIT 1)"
            )
            return "author"
        if choice == 1:
            cursor.execute(
                "UPDATE changesets_changeset SET at = at + interval '1 second'"
                " WHERE id = (SELECT id FROM changesets_changeset ORDER BY random() LIMIT 1)"
            )
            return "at"
        if choice == 2:
            cursor.execute(
                "UPDATE changesets_changeset SET comment = comment || ' '"
                " WHERE id = (SELECT id FROM changesets_changeset ORDER BY random() LIMIT 1)"
            )
            return "comment"
        if choice == 3:
            cursor.execute(
                "UPDATE changesets_revision SET after = jsonb_set(after, '{i}', '999')"
                " WHERE id = (SELECT id FROM changesets_revision WHERE after IS NOT NULL"
                " ORDER BY random() LIMIT 1)"
            )
            return "revision after"
        if choice == 4:
            cursor.execute(
                "UPDATE changesets_revision SET before_version = before_version + 1"
                " WHERE id = (SELECT id FROM changesets_revision WHERE before_version IS NOT NULL"
                " ORDER BY random() LIMIT 1)"
            )
            return "revision version"
        if choice == 5:
            cursor.execute(
                "DELETE FROM changesets_revision"
                " WHERE id = (SELECT id FROM changesets_revision ORDER BY random() LIMIT 1)"
            )
            return "revision deleted"
        if choice == 6:
            cursor.execute(
                "DELETE FROM changesets_revision WHERE changeset_id ="
                " (SELECT id FROM changesets_changeset ORDER BY random() LIMIT 1)"
            )
            cursor.execute(
                "DELETE FROM changesets_journalentry WHERE changeset_id NOT IN"
                " (SELECT changeset_id FROM changesets_revision)"
            )
            cursor.execute(
                "DELETE FROM changesets_changeset c WHERE NOT EXISTS"
                " (SELECT 1 FROM changesets_revision r WHERE r.changeset_id = c.id)"
            )
            return "changeset deleted"
        if choice == 7:
            # The copies of the changeset's time and seq that as-of and history read.
            cursor.execute(
                "UPDATE changesets_revision SET at = at - interval '1 day'"
                " WHERE id = (SELECT id FROM changesets_revision ORDER BY random() LIMIT 1)"
            )
            return "revision at"
        if choice == 8:
            # Moved to another changeset's seq (the foreign key, migration 0031,
            # refuses a seq no changeset has), one that has no revision of its key.
            cursor.execute(
                "UPDATE changesets_revision r SET seq = ("
                "  SELECT c.seq FROM changesets_changeset c WHERE c.seq <> r.seq"
                "  AND NOT EXISTS (SELECT 1 FROM changesets_revision o WHERE o.seq = c.seq"
                "   AND (o.namespace, o.kind, o.slug) = (r.namespace, r.kind, r.slug))"
                "  ORDER BY random() LIMIT 1)"
                " WHERE id = (SELECT id FROM changesets_revision ORDER BY random() LIMIT 1)"
            )
            return "revision seq"
        cursor.execute(
            "UPDATE changesets_revision SET slug = slug || 'x'"
            " WHERE id = (SELECT id FROM changesets_revision ORDER BY random() LIMIT 1)"
        )
        return "revision key"


def test_one_hundred_random_tamperings_are_all_detected(history):
    rng = random.Random(2026)
    missed = []
    for trial in range(100):
        sid = transaction.savepoint()
        what = _tamper(rng)
        if verify() is None:
            missed.append((trial, what))
        transaction.savepoint_rollback(sid)
    assert verify() is None  # every trial was rolled back
    assert missed == [], missed


def test_verify_log_command_exits_non_zero_at_the_first_break(history):
    sid = transaction.savepoint()
    with connection.cursor() as cursor:
        _disable_guards(cursor)
        cursor.execute("UPDATE changesets_changeset SET comment = 'edited' WHERE seq = 5")
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("verify_log", "--no-progress", stderr=err)
    assert exited.value.code == 1
    assert "BROKEN at seq 5" in err.getvalue()
    transaction.savepoint_rollback(sid)


def test_removing_the_newest_changeset_is_detected_by_the_head(history):
    with connection.cursor() as cursor:
        _disable_guards(cursor)
        newest = Changeset.objects.order_by("-seq").first()
        cursor.execute("DELETE FROM changesets_revision WHERE changeset_id = %s", [newest.id])
        cursor.execute("DELETE FROM changesets_journalentry WHERE changeset_id = %s", [newest.id])
        cursor.execute("DELETE FROM changesets_changeset WHERE id = %s", [newest.id])
    broken = verify()
    assert broken is not None and "log head" in broken.reason


def test_a_plain_update_of_a_revision_is_still_refused(history):
    """The guard lets through only erasure-shaped updates (0017); everything else is refused."""
    revision = Revision.objects.filter(after__isnull=False).first()
    attempts = [
        (
            "UPDATE changesets_revision SET after = jsonb_set(after, '{i}', '999') WHERE id = %s",
            False,
        ),
        ("UPDATE changesets_revision SET salt = NULL, sealed = '{}' WHERE id = %s", False),
        ("DELETE FROM changesets_revision WHERE id = %s", False),
        # With the erasure marker set, a change that is not an erasure is still refused.
        (
            "UPDATE changesets_revision SET after = jsonb_set(after, '{i}', '999'),"
            " salt = NULL, sealed = '{}' WHERE id = %s",
            True,
        ),
        (
            "UPDATE changesets_revision SET slug = 'x', salt = NULL, sealed = '{}' WHERE id = %s",
            True,
        ),
        (
            "UPDATE changesets_revision SET after = '{}', salt = NULL, sealed = '{}' WHERE id = %s",
            True,
        ),
        # An erasure that keeps the salt (so the erased value stays brute-forceable): refused.
        (
            "UPDATE changesets_revision SET after = jsonb_set(after, '{i}', '\"[erased]\"'),"
            " sealed = '{}' WHERE id = %s",
            True,
        ),
    ]
    for sql, marker in attempts:
        sid = transaction.savepoint()
        with pytest.raises(Exception, match="append-only"), connection.cursor() as cursor:
            if marker:
                cursor.execute("SET LOCAL atlas.erasing = 'on'")
            cursor.execute(sql, [revision.pk])
        transaction.savepoint_rollback(sid)
    with connection.cursor() as cursor:  # the one shape it admits
        cursor.execute("SET LOCAL atlas.erasing = 'on'")
        cursor.execute(
            "UPDATE changesets_revision SET after = jsonb_set(after, '{i}', '\"[erased]\"'),"
            " salt = NULL, sealed = '{}' WHERE id = %s",
            [revision.pk],
        )
        assert cursor.rowcount == 1


def test_changesets_and_erasures_stay_undeletable(history):
    for sql in (
        "UPDATE changesets_changeset SET comment = 'x' WHERE seq = 1",
        "DELETE FROM changesets_changeset WHERE seq = 1",
    ):
        sid = transaction.savepoint()
        with pytest.raises(Exception, match="append-only"), connection.cursor() as cursor:
            cursor.execute("SET LOCAL atlas.erasing = 'on'")
            cursor.execute(sql)
        transaction.savepoint_rollback(sid)
