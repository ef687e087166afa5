"""Migrations that rewrite the log, applied to a database that already holds one.

A migration tested only on an empty database can fail on every real one:
0013's first version built its index over the rows' replaced versions too
(CREATE INDEX indexes what the backfill's UPDATE had just superseded) and
failed on any log with revisions.
"""

from __future__ import annotations

import importlib
import io

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from changesets import chain, rechain
from changesets.models import Changeset, JournalEntry, JournalTally, LogHead, Revision
from changesets.selectors.log import previous_hash

pytestmark = pytest.mark.django_db(transaction=True)

NS = "acme.orders"
BEFORE_CHANGED_KEYS = [("changesets", "0012_journal_seq")]
BEFORE_JOURNAL_GONE = [("changesets", "0025_revision_partitions")]
JOURNAL_GONE = importlib.import_module("changesets.migrations.0026_journal_published_gone")


def migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


def latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def test_changed_keys_migrate_onto_a_log_with_revisions(staff, namespace, write):
    write(staff, f"{NS}/order/a", {"x": {"y": 1}, "z": 1})
    write(staff, f"{NS}/order/a", {"x": {"y": 2}, "z": 1})
    write(staff, f"{NS}/order/b", {"k": [1]})
    write(staff, f"{NS}/order/b", None)
    expected = dict(Revision.objects.values_list("id", "changed"))
    assert len(expected) == 4 and all(expected.values())

    migrate(BEFORE_CHANGED_KEYS)  # the log as it was before changed keys existed
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'changesets_revision' AND column_name = 'changed'"
        )
        assert cursor.fetchone()[0] == 0
    with connection.cursor() as cursor:
        # Full pages, so the backfill's updates cannot stay on their page (HOT), as
        # in any real log: the replaced versions then stay in the table until COMMIT.
        cursor.execute(
            "INSERT INTO changesets_revision (changeset_id, seq, branch, at, namespace, kind,"
            " slug, op, before, after, before_version, after_version)"
            " SELECT c.id, c.seq, '', c.at, %s, 'bulk', 'r' || n, 'update',"
            " jsonb_build_object('n', n, 'pad', repeat('x', 200)),"
            " jsonb_build_object('n', n + 1, 'pad', repeat('x', 200)), 1, 2"
            " FROM generate_series(1, 3000) n,"
            " (SELECT id, seq, at FROM changesets_changeset ORDER BY seq LIMIT 1) c",
            [NS],
        )
    # The raw rows are not in the chain, and 0018 refuses to re-chain a log that
    # does not verify as v1: hash them in (as v1) before it runs, as if written so.
    migrate([("changesets", "0017_erasure_chain_v2")])
    with connection.cursor() as cursor:
        rechain.rechain_to_v1(cursor, progress=False)
    migrate(latest())

    assert Revision.objects.filter(kind="bulk", changed=["/n"]).count() == 3000
    expected_ids = list(expected)
    assert dict(Revision.objects.filter(id__in=expected_ids).values_list("id", "changed")) == (
        expected
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM changesets_revision WHERE atlas_key_terms(branch, namespace,"
            " changed, op) && atlas_key_query(branch, namespace, '/x')"
        )
        assert cursor.fetchone()[0] == 2


BEFORE_BYTEA = [("changesets", "0026_journal_published_gone")]
HASH_COLUMNS = {
    ("changesets_changeset", "prev_hash"),
    ("changesets_changeset", "hash"),
    ("changesets_changeset", "v1_hash"),
    ("changesets_loghead", "hash"),
    ("changesets_loghead", "prev_hash"),
}


@pytest.fixture
def back_to_latest():
    """Whatever a test migrated to, the database ends at the latest migration."""
    yield
    migrate(latest())


def _hash_column_types() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_name IN ('changesets_changeset', 'changesets_loghead')"
            " AND column_name LIKE '%%hash'"
        )
        rows = cursor.fetchall()
    assert {(t, c) for t, c, _ in rows} == HASH_COLUMNS
    return {kind for _, _, kind in rows}


def _verify_log() -> str:
    out = io.StringIO()
    call_command("verify_log", "--no-progress", stdout=out)
    return out.getvalue()


def test_a_log_written_with_hex_hashes_verifies_after_they_become_bytes(
    staff, namespace, write, back_to_latest
):
    for i in range(5):
        write(staff, f"{NS}/order/o{i % 2}", {"i": i, "s": "é" * i})
    written = list(Changeset.objects.order_by("seq").values_list("seq", "prev_hash", "hash"))
    head = LogHead.objects.values_list("seq", "hash", "prev_hash").get(pk=1)
    # Back past 0034 each row gets the prev_hash it did not store: the previous hash.
    assert {prev for _, prev, _ in written} == {None}
    hashes = [chain.GENESIS, *(h for _, _, h in written)]
    written = [(seq, hashes[i], h) for i, (seq, _, h) in enumerate(written)]

    migrate(BEFORE_BYTEA)  # the columns as every log before 0027 has them: hex text
    assert _hash_column_types() == {"character varying"}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, prev_hash, hash, v1_hash FROM changesets_changeset ORDER BY seq"
        )
        assert cursor.fetchall() == [(*row, None) for row in written]
        cursor.execute("SELECT seq, hash, prev_hash FROM changesets_loghead WHERE id = 1")
        assert cursor.fetchone() == head

    migrate(latest())
    assert _hash_column_types() == {"bytea"}
    assert list(Changeset.objects.order_by("seq").values_list("seq", "prev_hash", "hash")) == (
        written
    )
    assert "ok: 5 changeset(s) verified" in _verify_log()
    after = write(staff, f"{NS}/order/o0", {"after": True}).changeset
    assert previous_hash(after) == written[-1][2]
    assert "ok: 6 changeset(s) verified" in _verify_log()


def test_an_empty_log_head_becomes_null_and_the_first_write_chains_from_the_genesis(
    staff, namespace, write, back_to_latest
):
    migrate(BEFORE_BYTEA)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM changesets_loghead")
        cursor.execute(
            "INSERT INTO changesets_loghead (id, seq, at, hash, prev_hash)"
            " VALUES (1, 0, NULL, '', '')"
        )
    migrate(latest())
    with connection.cursor() as cursor:
        cursor.execute("SELECT hash IS NULL AND prev_hash IS NULL FROM changesets_loghead")
        assert cursor.fetchone()[0] is True
    first = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    assert previous_hash(first) == chain.GENESIS
    assert "ok: 1 changeset(s) verified" in _verify_log()


def journal_table() -> tuple[list[str], list[str]]:
    """The journal table's storage parameters and index names."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'changesets_journalentry'::regclass"
        )
        options = cursor.fetchone()[0] or []
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'changesets_journalentry'"
        )
        return sorted(options), sorted(r[0] for r in cursor.fetchall())


def test_published_journal_entries_go_in_batches_and_outstanding_ones_stay(
    staff, namespace, write, monkeypatch
):
    made = [write(staff, f"{NS}/order/k{i}", {"n": i}).changeset.id for i in range(9)]
    published, outstanding = made[:6], made[6:]
    migrate(BEFORE_JOURNAL_GONE)  # the previous release kept every published entry
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE changesets_journalentry SET phase = 'published', published_at = now(),"
            " attempts = 1 WHERE changeset_id = ANY(%s)",
            [published],
        )
        cursor.execute(  # published after two failed attempts
            "UPDATE changesets_journalentry SET attempts = 3, failures = 2 WHERE changeset_id = %s",
            [published[1]],
        )
        cursor.execute(  # still failing
            "UPDATE changesets_journalentry SET attempts = 1, failures = 1,"
            " last_error = 'hook: index down' WHERE changeset_id = %s",
            [outstanding[0]],
        )
    assert "journal_failed" in journal_table()[1]
    monkeypatch.setattr(JOURNAL_GONE, "BATCH", 2)  # several batches

    migrate(latest())

    left = {e.pk: e for e in JournalEntry.objects.all()}
    assert set(left) == set(outstanding)
    failing = left[outstanding[0]]
    assert (failing.phase, failing.failures, failing.last_error) == (
        "committed",
        1,
        "hook: index down",
    )
    # Every failure counted so far, the deleted entries' too: the counter goes on.
    assert JournalTally.objects.get().failures == 3
    options, indexes = journal_table()
    assert options == ["autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=1000"]
    assert "journal_failed" not in indexes and "journal_pending" in indexes

    # Stopped halfway, a non-atomic migration runs again from the top: nothing changes.
    with connection.schema_editor(atomic=False) as editor:
        JOURNAL_GONE.forward(MigrationExecutor(connection).loader.project_state().apps, editor)
    assert set(JournalEntry.objects.values_list("pk", flat=True)) == set(outstanding)
    assert JournalTally.objects.get().failures == 3

    migrate(BEFORE_JOURNAL_GONE)  # the reverse: the index and the defaults come back
    options, indexes = journal_table()
    assert options == [] and "journal_failed" in indexes
    migrate(latest())


BEFORE_DERIVED_MESSAGE = [("changesets", "0032_time_bound_by_search")]


def _stored_messages() -> list[tuple[int, str | None]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT seq, message FROM changesets_changeset ORDER BY seq")
        return list(cursor.fetchall())


def test_a_message_is_stored_as_null_and_read_as_the_rule_on_either_side_of_0033(
    staff, namespace, write, back_to_latest
):
    """New rows leave the message to the rule (NULL, 23 bytes saved); every read, the
    API and the chain see the rule's text; back past 0033 the text is written in."""
    from changesets.models import default_message

    write(staff, f"{NS}/order/a", {"n": 1})
    write(staff, f"{NS}/order/a", {"n": 2})
    assert [m for _, m in _stored_messages()] == [None, None]
    texts = [default_message("PutEntity", 1)] * 2
    assert [c.message for c in Changeset.objects.order_by("seq")] == texts
    assert [r.changeset.message for r in Revision.objects.select_related("changeset")] == texts
    assert "ok: 2 changeset(s) verified" in _verify_log()

    migrate(BEFORE_DERIVED_MESSAGE)
    assert [m for _, m in _stored_messages()] == texts
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT is_nullable FROM information_schema.columns"
            " WHERE table_name = 'changesets_changeset' AND column_name = 'message'"
        )
        assert cursor.fetchone() == ("NO",)

    migrate(latest())
    write(staff, f"{NS}/order/a", {"n": 3})
    assert [m for _, m in _stored_messages()] == [*texts, None]  # old rows keep their text
    assert "ok: 3 changeset(s) verified" in _verify_log()


BEFORE_NAMESPACE_SEEKS = [("changesets", "0036_write_moved_check")]


def _changeset_indexes() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'changesets_changeset'"
        )
        return dict(cursor.fetchall())


def _statistics() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT stxname FROM pg_statistic_ext WHERE stxrelid = 'changesets_changeset'::regclass"
        )
        return {name for (name,) in cursor.fetchall()}


def test_the_namespace_indexes_replace_the_gin_index_and_back(
    staff, namespace, write, back_to_latest
):
    """0037 puts the position indexes (and their statistics, from PostgreSQL 14) in
    place of the GIN index over every changeset; back past it the GIN index returns.
    A namespace's page is the same on either side."""
    from changesets.selectors.log import changeset_list

    write(staff, f"{NS}/order/a", {"n": 1})
    write(staff, f"{NS}/order/b", {"n": 1})
    seqs = [c.seq for c in changeset_list(namespaces=None, namespace=NS)]
    assert len(seqs) == 2
    new = {"changeset_ns1_seq", "changeset_ns2_seq", "changeset_ns3_more"}
    assert new <= set(_changeset_indexes())
    assert "changeset_namespaces" not in _changeset_indexes()
    if connection.pg_version >= 140000:
        assert _statistics() == {f"changeset_ns{p}_stats" for p in (1, 2, 3)}

    migrate(BEFORE_NAMESPACE_SEEKS)
    indexes = _changeset_indexes()
    assert not new & set(indexes)
    assert "USING gin (namespaces)" in indexes["changeset_namespaces"]
    assert not _statistics()
    found = Changeset.objects.filter(namespaces__contains=[NS]).order_by("-seq")
    assert [c.seq for c in found] == seqs

    migrate(latest())
    write(staff, f"{NS}/order/c", {"n": 1})
    assert [c.seq for c in changeset_list(namespaces=[NS])] == [seqs[0] + 1, *seqs]
