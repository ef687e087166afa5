"""The one write path, ``changeset_apply``, against DESIGN's invariants 1-7.

Everything here goes through the service on the baseline store; the HTTP
layer is tested elsewhere. Tests use the rolled-back ``db`` fixture unless a
real commit or rollback is the point (``transaction=True``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from atlas.exceptions import (
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    PreconditionFailed,
)
from changesets import chain, partitions
from changesets.hooks import in_write_transaction
from changesets.models import (
    AppendOnlyError,
    Changeset,
    JournalEntry,
    JournalPhase,
    Op,
    Revision,
    Rpc,
)
from changesets.ops import DeleteOp, PatchOp, PutOp, canonical
from changesets.partitions import CHANGESETS
from changesets.services import apply as services
from changesets.services.apply import changeset_apply
from changesets.signals import changeset_committed
from entities.models import Entity
from entities.store import baseline
from tests.changesets.helpers import (
    assert_json_identical,
    assert_nothing_written,
    assert_revision,
    entity_table,
    head_seq,
    key,
    log_snapshot,
    only_revision,
    replayed_table,
    revisions_by_key,
)

NS = "acme.orders"
A = key(f"{NS}/order/a")
B = key(f"{NS}/order/b")
C = key(f"{NS}/order/c")


def apply(actor: Any, *ops: Any, rpc: str = Rpc.BATCH_MUTATE, **kw: Any) -> services.ApplyResult:
    """Apply ``ops`` as one batch, numbering their pointers ``/ops/<i>``."""
    numbered = [dataclasses.replace(op, pointer=f"/ops/{i}") for i, op in enumerate(ops)]
    return changeset_apply(store=baseline, actor=actor, ops=numbered, rpc=rpc, **kw)


def version_of(k: Any) -> int | None:
    stored = baseline.get(k)
    return stored.version if stored else None


# --- invariant 1: every write is a changeset, history is complete ----------------


def test_each_write_is_one_changeset_whose_revision_matches_the_write(writer, namespace, write):
    created = write(writer, f"{NS}/order/a", {"n": 1})
    updated = write(writer, f"{NS}/order/a", {"n": 2})
    patched = write(writer, f"{NS}/order/a", {"m": 3}, patch=True)
    deleted = write(writer, f"{NS}/order/a", None)

    assert Changeset.objects.count() == 4
    assert [r.changeset.rpc for r in (created, updated, patched, deleted)] == [
        Rpc.PUT_ENTITY,
        Rpc.PUT_ENTITY,
        Rpc.PATCH_ENTITY,
        Rpc.DELETE_ENTITY,
    ]
    assert_revision(
        only_revision(created.changeset),
        op=Op.CREATE,
        key=A,
        before=None,
        after={"n": 1},
        before_version=None,
        after_version=1,
    )
    assert_revision(
        only_revision(updated.changeset),
        op=Op.UPDATE,
        before={"n": 1},
        after={"n": 2},
        before_version=1,
        after_version=2,
    )
    assert_revision(
        only_revision(patched.changeset),
        op=Op.UPDATE,
        before={"n": 2},
        after={"n": 2, "m": 3},
        before_version=2,
        after_version=3,
    )
    assert_revision(
        only_revision(deleted.changeset),
        op=Op.DELETE,
        before={"n": 2, "m": 3},
        after=None,
        before_version=3,
        after_version=None,
    )
    assert not Entity.objects.exists()


def test_live_entity_points_at_the_changeset_that_last_wrote_it(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})
    last = write(writer, f"{NS}/order/a", {"n": 2}).changeset

    assert Entity.objects.get(slug="a").changeset_id == last.id


def test_replaying_revisions_reproduces_the_entity_table_after_random_writes(make_user):
    writer = make_user("bill", writer=[NS, "acme.billing"])
    rng = random.Random(20240611)
    keys = [
        key(f"{ns}/{kind}/{slug}")
        for ns in (NS, "acme.billing")
        for kind in ("order", "line")
        for slug in ("s1", "s2")
    ]
    model: dict[Any, dict] = {}  # what the table should hold, kept independently of the app
    versions: dict[Any, int] = {}  # last version each key ever had
    seen = {"deletes": 0, "recreates": 0, "unchanged": 0}

    for step in range(50):
        k = rng.choice(keys)
        roll = rng.random()
        before = model.get(k)
        if before is not None and roll < 0.3:
            op, after = DeleteOp(k), None
        elif before is not None and roll < 0.55:
            patch = {f"f{rng.randrange(3)}": rng.choice([step, None, "x", True, [step]])}
            op = PatchOp(k, patch)
            after = {**before, **patch}
            after = {f: v for f, v in after.items() if v is not None}
        else:
            after = {"step": step, "v": rng.choice([1, 1.0, True, "1", [1], {"n": 1}])}
            op = PutOp(k, after)

        result = apply(writer, op)

        if before is not None and after is not None and canonical(after) == canonical(before):
            assert result.changeset is None
            seen["unchanged"] += 1
            continue
        cs = result.changeset
        assert cs is not None, f"step {step}: {op} wrote no changeset"
        expected_op = Op.DELETE if after is None else (Op.CREATE if before is None else Op.UPDATE)
        new_version = None if after is None else versions.get(k, 0) + 1
        assert_revision(
            only_revision(cs),
            op=expected_op,
            key=k,
            before=before,
            after=after,
            before_version=versions.get(k) if before is not None else None,
            after_version=new_version,
        )
        if after is None:
            seen["deletes"] += 1
            model.pop(k)
        else:
            seen["recreates"] += before is None and k in versions
            model[k] = after
            versions[k] = new_version

    table = entity_table()
    assert table == {k: (canonical(content), versions[k]) for k, content in model.items()}
    assert replayed_table() == table
    assert Changeset.objects.count() == Revision.objects.count() == 50 - seen["unchanged"]
    assert seen["deletes"] >= 3 and seen["recreates"] >= 3, seen


# --- invariant 2: atomic -----------------------------------------------------------


@pytest.fixture
def two_entities(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})
    write(writer, f"{NS}/order/b", {"n": 1})


@pytest.mark.parametrize(
    ("third_op", "error"),
    [
        pytest.param(PutOp(C, {"n": 1}, if_match=7), PreconditionFailed, id="precondition-412"),
        pytest.param(PutOp(key("no.such/order/c"), {"n": 1}), NotFound, id="namespace-404"),
        pytest.param(PutOp(C, {"blob": "x" * 200}), PayloadTooLarge, id="too-large-413"),
        pytest.param(DeleteOp(C), NotFound, id="delete-missing-404"),
    ],
)
def test_a_batch_whose_third_op_fails_leaves_no_trace(
    writer, two_entities, settings, third_op, error
):
    settings.ATLAS_MAX_CONTENT_BYTES = 100
    snapshot = log_snapshot()

    with pytest.raises(error) as exc_info:
        apply(writer, PutOp(A, {"n": 2}), DeleteOp(B), third_op, PutOp(key(f"{NS}/order/d"), {}))

    assert exc_info.value.pointer == "/ops/2"
    assert exc_info.value.status == error.status
    assert_nothing_written(snapshot)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fail_at", ["in-log-statement", "after-log-statement", "write-hook"])
def test_a_failure_after_entity_writes_rolls_the_entity_rows_back(
    writer, namespace, write, monkeypatch, fail_at
):
    write(writer, f"{NS}/order/a", {"n": 1})
    write(writer, f"{NS}/order/b", {"n": 1})
    snapshot = log_snapshot()
    logged = []

    real_write_log = services._write_log

    def spy_write_log(changeset, *args, **kw):
        assert kw["entity_sql"] is not None  # the entity rows are written by this statement
        logged.append(changeset)
        out = real_write_log(changeset, *args, **kw)  # rows, seq, changeset, revisions, journal
        if fail_at == "after-log-statement":
            raise RuntimeError(f"injected failure at {fail_at}")
        return out

    def boom(*args, **kw):
        raise RuntimeError(f"injected failure at {fail_at}")

    monkeypatch.setattr(services, "_write_log", spy_write_log)
    if fail_at == "in-log-statement":
        # PostgreSQL fails while computing the chain hash: the entity CTEs have run
        # (the head's update reads their counts first) and must be rolled back.
        monkeypatch.setattr(
            chain, "hash_sql", lambda **kw: "('injected failure' || 1)::int::text::bytea"
        )

    with (
        pytest.raises((RuntimeError, DatabaseError), match="injected"),
        contextlib.ExitStack() as stack,
    ):
        if fail_at == "write-hook":
            stack.enter_context(in_write_transaction(boom))
        apply(writer, PutOp(A, {"n": 2}), DeleteOp(B), PutOp(C, {"n": 1}))

    assert logged, "the failure must come in or after the statement writing the entity rows"
    assert not connection.in_atomic_block
    assert_nothing_written(snapshot)
    # ...and the store still works: the next write commits normally.
    monkeypatch.undo()
    assert apply(writer, PutOp(A, {"n": 2})).changeset.seq == snapshot.head_seq + 1


# --- invariant 3: no empty changesets ---------------------------------------------------


def test_byte_identical_put_is_unchanged_and_writes_no_changeset(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1, "tags": ["x"], "m": {"b": 1.5, "a": None}})
    snapshot = log_snapshot()

    # Same JSON value, keys in another order: jsonb and canonical() agree it is identical.
    result = write(writer, f"{NS}/order/a", {"m": {"a": None, "b": 1.5}, "tags": ["x"], "n": 1})

    assert result.changeset is None
    assert [r.status for r in result.results] == ["unchanged"]
    assert result.results[0].version == 1
    assert_nothing_written(snapshot)


def test_empty_patch_and_identical_patch_write_no_changeset(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})
    snapshot = log_snapshot()

    assert write(writer, f"{NS}/order/a", {}, patch=True).changeset is None
    assert write(writer, f"{NS}/order/a", {"n": 1}, patch=True).changeset is None
    assert_nothing_written(snapshot)


@pytest.mark.parametrize(
    "value",
    [
        1e-7,
        0.1,
        1.0,
        100.0,
        2.5,
        1e16,
        1.5e300,
        12345678901234567890.0,
        -0.0,
    ],
)
def test_reputting_a_stored_float_is_unchanged(writer, namespace, write, value):
    """What the client sends twice must compare identical to what jsonb gave back."""
    write(writer, f"{NS}/order/a", {"x": value})
    snapshot = log_snapshot()

    result = write(writer, f"{NS}/order/a", {"x": value})

    assert [r.status for r in result.results] == ["unchanged"]
    assert_nothing_written(snapshot)


def test_dry_run_reports_results_but_writes_nothing(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})
    snapshot = log_snapshot()

    result = apply(writer, PutOp(A, {"n": 2}), PutOp(B, {"n": 1}), DeleteOp(A), dry_run=True)

    assert result.dry_run is True
    assert result.changeset is None
    assert [(r.pointer, r.status, r.version) for r in result.results] == [
        ("/ops/0", "updated", 2),
        ("/ops/1", "created", 1),
        ("/ops/2", "deleted", None),
    ]
    assert result.entities[A] is None
    assert result.entities[B].content == {"n": 1}
    assert [r.op for r in result.revisions] == [Op.DELETE, Op.CREATE]
    assert_nothing_written(snapshot)


def test_dry_run_still_checks_preconditions(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})

    with pytest.raises(PreconditionFailed):
        apply(writer, PutOp(A, {"n": 2}, if_match=9), dry_run=True)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"a": 1}, {"a": True}),
        ({"a": True}, {"a": 1}),
        ({"a": 1}, {"a": 1.0}),
        ({"a": 1.0}, {"a": 1}),
        ({"a": 0}, {"a": False}),
        ({"a": 1}, {"a": "1"}),
        ({"a": None}, {}),
    ],
    ids=["1-true", "true-1", "1-1.0", "1.0-1", "0-false", "1-str", "null-absent"],
)
def test_values_python_calls_equal_but_json_does_not_are_an_update(
    writer, namespace, write, first, second
):
    write(writer, f"{NS}/order/a", first)

    result = write(writer, f"{NS}/order/a", second)

    assert [r.status for r in result.results] == ["updated"]
    assert_revision(
        only_revision(result.changeset), op=Op.UPDATE, before=first, after=second, after_version=2
    )
    assert_json_identical(baseline.get(A).content, second)


# --- invariant 4: one revision per (entity, changeset) --------------------------------------


def test_batch_touching_a_key_twice_folds_into_one_revision(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})

    result = apply(
        writer, PutOp(A, {"n": 2}), PatchOp(A, {"m": 1}), PutOp(A, {"n": 3}), PutOp(B, {"n": 1})
    )

    revisions = revisions_by_key(result.changeset)
    assert set(revisions) == {A, B}
    assert_revision(
        revisions[A],
        op=Op.UPDATE,
        before={"n": 1},
        after={"n": 3},
        before_version=1,
        after_version=2,
    )
    assert result.changeset.op_count == 2


# A revision written again by SQL, whatever writes it: ``{seq}`` and ``{slug}`` are the
# copy's (SQL), ``{where}`` picks the rows copied.
COPY_REVISION = (
    "INSERT INTO changesets_revision (changeset_id, seq, branch, at, namespace, kind, slug,"
    " op, undo, undo_gone, after, before_version, after_version, changed)"
    " SELECT changeset_id, {seq}, branch, at, namespace, kind, {slug}, op, undo, undo_gone,"
    " after, before_version, after_version, changed FROM changesets_revision WHERE {where}"
)


def test_the_database_refuses_a_second_revision_of_an_entity_in_one_changeset(
    writer, namespace, write
):
    """Invariant 4 in PostgreSQL too: ``revision_seq_entity``, unique per seq and key (a
    changeset has exactly one seq), whatever writes the row."""
    write(writer, f"{NS}/order/a", {"n": 1})
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = 'changesets_revision'::regclass AND conname = 'revision_seq_entity'"
        )
        assert cursor.fetchall() == [("UNIQUE (seq, namespace, kind, slug)",)]
    refused = pytest.raises(IntegrityError, match="unique constraint")
    with refused, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(COPY_REVISION.format(seq="seq", slug="slug", where="slug = 'a'"))
    with transaction.atomic(), connection.cursor() as cursor:  # another key at that seq is fine
        cursor.execute(COPY_REVISION.format(seq="seq", slug="'b'", where="slug = 'a'"))


DEFERRED = "DEFERRABLE INITIALLY DEFERRED"


def test_the_database_refuses_a_revision_of_no_changeset(writer, namespace, write):
    """Every revision belongs to a changeset, in PostgreSQL too: the foreign key
    ``revision_changeset_seq`` (migration 0031) names it by the seq the revision
    copies; since migration 0038 each revision partition has its own, to the
    changeset partition of the same seqs. Deferred like Django's keys, so checked
    here at once."""
    write(writer, f"{NS}/order/a", {"n": 1})
    write(writer, f"{NS}/order/a", {"n": 2})
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.conrelid::regclass::text, pg_get_constraintdef(c.oid) FROM pg_constraint c"
            " WHERE c.contype = 'f' AND (c.conrelid = 'changesets_revision'::regclass"
            " OR c.conrelid IN (SELECT inhrelid FROM pg_inherits"
            " WHERE inhparent = 'changesets_revision'::regclass)) ORDER BY 1"
        )
        keys = cursor.fetchall()
        parts = partitions.partitions(cursor)
        holder = partitions.partition_name
        assert keys == [
            (p.name, f"FOREIGN KEY (seq) REFERENCES {holder(p.lower, CHANGESETS)}(seq) {DEFERRED}")
            for p in parts
        ]
        cursor.execute("SELECT max(seq) FROM changesets_changeset")
        (last,) = cursor.fetchone()
    # A copy of the first write's revision at the next seq (no changeset has it
    # yet; its partition exists), then at the second write's (which exists).
    copy = COPY_REVISION.format(seq="%s", slug="'b'", where="seq = %s")
    refused = pytest.raises(IntegrityError, match="revision_changeset_seq")
    with refused, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(copy, [last + 1, last - 1])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(copy, [last, last - 1])


def test_create_then_update_in_one_batch_is_one_create(writer, namespace):
    result = apply(writer, PutOp(A, {"n": 1}), PatchOp(A, {"m": 2}))

    assert_revision(
        only_revision(result.changeset),
        op=Op.CREATE,
        before=None,
        after={"n": 1, "m": 2},
        before_version=None,
        after_version=1,
    )


def test_key_created_and_deleted_in_one_batch_leaves_no_revision(writer, namespace):
    result = apply(writer, PutOp(A, {"n": 1}), PutOp(B, {"n": 1}), DeleteOp(A))

    assert set(revisions_by_key(result.changeset)) == {B}
    assert result.changeset.op_count == 1
    assert not Revision.objects.filter(slug="a").exists()


def test_batch_whose_only_key_is_created_and_deleted_writes_no_changeset(writer, namespace):
    snapshot = log_snapshot()

    result = apply(writer, PutOp(A, {"n": 1}), DeleteOp(A))

    assert result.changeset is None
    # The key ends where it began (absent): its ops report what happened to the store.
    assert [(r.status, r.version) for r in result.results] == [
        ("unchanged", None),
        ("unchanged", None),
    ]
    assert_nothing_written(snapshot)


def test_ops_on_a_key_that_ends_where_it_began_report_unchanged(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})
    snapshot = log_snapshot()

    result = apply(writer, PutOp(A, {"n": 2}), DeleteOp(A), PutOp(A, {"n": 1}), PutOp(B, {}))

    assert [(r.status, r.version) for r in result.results] == [
        ("unchanged", 1),
        ("unchanged", 1),
        ("unchanged", 1),
        ("created", 1),
    ]
    assert set(revisions_by_key(result.changeset)) == {B}
    assert log_snapshot().head_seq == snapshot.head_seq + 1


def test_delete_and_recreate_of_an_existing_key_is_one_update(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})

    result = apply(writer, DeleteOp(A), PutOp(A, {"n": 2}, if_none_match=True))

    assert_revision(
        only_revision(result.changeset),
        op=Op.UPDATE,
        before={"n": 1},
        after={"n": 2},
        before_version=1,
        after_version=2,
    )


def test_batch_that_puts_a_key_back_as_it_was_writes_no_changeset(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})
    snapshot = log_snapshot()

    result = apply(writer, PutOp(A, {"n": 2}), DeleteOp(A), PutOp(A, {"n": 1}))

    assert result.changeset is None
    assert_nothing_written(snapshot)


def test_op_count_equals_the_number_of_revisions(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})
    write(writer, f"{NS}/order/b", {"n": 1})

    result = apply(
        writer,
        PutOp(A, {"n": 2}),
        PutOp(A, {"n": 3}),
        DeleteOp(B),
        PutOp(C, {"n": 1}),
        PutOp(key(f"{NS}/order/d"), {"n": 1}),
        DeleteOp(key(f"{NS}/order/d")),
    )

    assert result.changeset.op_count == result.changeset.revisions.count() == 3
    assert result.changeset.namespaces == [NS]
    assert [r.op for r in result.changeset.revisions.order_by("slug")] == [
        Op.UPDATE,
        Op.DELETE,
        Op.CREATE,
    ]


# --- invariant 5: the author is the actor ------------------------------------------------


def test_author_is_the_actor_passed_in(writer, make_user, namespace, write):
    other = make_user("otto", writer=[NS])

    mine = write(writer, f"{NS}/order/a", {"n": 1}, comment="first").changeset
    theirs = write(other, f"{NS}/order/a", {"n": 2}).changeset

    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert (mine.author_id, mine.author_name, mine.comment) == (writer.pk, "wendy", "first")
    assert (theirs.author_id, theirs.author_name, theirs.comment) == (other.pk, "otto", "")


# --- invariant 6: commit order (service level; threads in test_concurrency) --------------


def test_seqs_are_contiguous_and_at_and_ids_follow_seq_order(writer, namespace, write):
    start = head_seq()
    made = [write(writer, f"{NS}/order/s{i % 4}", {"i": i}).changeset for i in range(20)]

    rows = list(Changeset.objects.order_by("seq"))
    assert [cs.seq for cs in rows] == list(range(start + 1, start + 21))
    assert [cs.id for cs in rows] == [cs.id for cs in made]
    assert [cs.id for cs in rows] == sorted(cs.id for cs in rows)
    ats = [cs.at for cs in rows]
    assert ats == sorted(ats)
    assert head_seq() == start + 20
    assert all(r.seq == r.changeset.seq for r in Revision.objects.select_related("changeset"))


# --- invariant 7: the log is never rewritten ---------------------------------------------


@pytest.fixture
def logged(writer, namespace, write):
    return write(writer, f"{NS}/order/a", {"n": 1}).changeset


def test_changeset_and_revision_refuse_save_and_delete_in_code(logged):
    revision = only_revision(logged)
    logged.comment = "rewritten"
    revision.after = {"n": 666}

    for row in (logged, revision):
        with pytest.raises(AppendOnlyError):
            row.save()
        with pytest.raises(AppendOnlyError):
            row.delete()

    logged.refresh_from_db()
    assert logged.comment == ""
    assert_revision(only_revision(logged), after={"n": 1})


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE changesets_changeset SET comment = 'rewritten'",
        "DELETE FROM changesets_changeset",
        "UPDATE changesets_revision SET after = '{}'::jsonb",
        "DELETE FROM changesets_revision",
    ],
)
def test_database_refuses_to_rewrite_the_log_with_raw_sql(logged, sql):
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)

    assert Changeset.objects.filter(comment="").count() == 1
    assert_revision(only_revision(logged), after={"n": 1})


@pytest.mark.parametrize("model", [Changeset, Revision])
def test_queryset_update_and_delete_hit_the_database_guard(logged, model):
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        model.objects.update(seq=999)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        model.objects.all().delete()

    assert model.objects.count() == 1


# --- versions ------------------------------------------------------------------------------


def test_update_bumps_version_by_one_per_changeset_however_often_the_batch_writes_it(
    writer, namespace, write
):
    write(writer, f"{NS}/order/a", {"n": 0})

    result = apply(writer, *[PutOp(A, {"n": i}) for i in range(1, 6)])

    assert [r.version for r in result.results] == [2] * 5
    assert version_of(A) == 2
    assert result.entities[A].version == 2


def test_recreated_key_continues_after_its_last_version(writer, namespace, write):
    assert write(writer, f"{NS}/order/a", {"n": 1}).results[0].version == 1
    assert write(writer, f"{NS}/order/a", {"n": 2}).results[0].version == 2
    write(writer, f"{NS}/order/a", None)

    recreated = write(writer, f"{NS}/order/a", {"n": 3})

    assert recreated.results[0].status == "created"
    assert version_of(A) == 3
    assert_revision(
        only_revision(recreated.changeset),
        op=Op.CREATE,
        before=None,
        before_version=None,
        after_version=3,
    )


def test_old_etag_never_matches_a_recreated_key(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})
    write(writer, f"{NS}/order/a", None)
    write(writer, f"{NS}/order/a", {"n": 2})  # v2

    with pytest.raises(PreconditionFailed):
        apply(writer, PutOp(A, {"n": 3}, if_match=1))


def test_if_match_with_a_stale_version_fails_with_the_ops_pointer(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})
    write(writer, f"{NS}/order/a", {"n": 2})
    snapshot = log_snapshot()

    with pytest.raises(PreconditionFailed) as exc_info:
        apply(writer, PutOp(B, {"n": 1}), PatchOp(A, {"n": 3}, if_match=1))

    assert exc_info.value.pointer == "/ops/1"
    assert exc_info.value.status == 412
    assert_nothing_written(snapshot)


def test_if_match_with_the_current_version_or_a_list_holding_it_succeeds(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})

    assert apply(writer, PutOp(A, {"n": 2}, if_match=1)).results[0].version == 2
    assert apply(writer, PutOp(A, {"n": 3}, if_match=(1, 2))).results[0].version == 3
    assert apply(writer, DeleteOp(A, if_match="*")).results[0].status == "deleted"


def test_later_ops_in_a_batch_see_the_version_earlier_ops_made(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})

    # Versions move per changeset, so within the batch A is "at" v2 after op 0.
    result = apply(writer, PutOp(A, {"n": 2}, if_match=1), PutOp(A, {"n": 3}, if_match=2))

    assert version_of(A) == 2
    assert_revision(only_revision(result.changeset), after={"n": 3}, after_version=2)


@pytest.mark.parametrize(
    "op",
    [
        PutOp(A, {"n": 1}, if_match="*"),
        PutOp(A, {"n": 1}, if_match=1),
        PatchOp(A, {"n": 1}, if_match="*"),
        DeleteOp(A, if_match="*"),
    ],
    ids=["put-star", "put-v1", "patch-star", "delete-star"],
)
def test_if_match_on_a_missing_key_fails(writer, namespace, op):
    with pytest.raises(PreconditionFailed) as exc_info:
        apply(writer, op)

    assert exc_info.value.pointer == "/ops/0"


@pytest.mark.parametrize("op", [DeleteOp(A), PatchOp(A, {"n": 1})], ids=["delete", "patch"])
def test_delete_or_patch_of_a_missing_key_without_if_match_is_not_found(writer, namespace, op):
    with pytest.raises(NotFound) as exc_info:
        apply(writer, PutOp(B, {"n": 1}), op)

    assert exc_info.value.pointer == "/ops/1"
    assert not Changeset.objects.exists()


def test_delete_of_a_missing_key_with_missing_ok_is_unchanged(writer, namespace):
    result = apply(writer, DeleteOp(A, missing_ok=True))

    assert result.changeset is None
    assert [r.status for r in result.results] == ["unchanged"]


def test_if_none_match_on_an_existing_key_fails(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1})

    with pytest.raises(PreconditionFailed) as exc_info:
        apply(writer, PutOp(A, {"n": 2}, if_none_match=True))

    assert exc_info.value.pointer == "/ops/0"
    assert version_of(A) == 1


def test_if_none_match_on_a_missing_key_creates_it(writer, namespace):
    result = apply(writer, PutOp(A, {"n": 1}, if_none_match=True))

    assert [(r.status, r.version) for r in result.results] == [("created", 1)]


# --- permissions in the service --------------------------------------------------------------


def test_reader_only_user_is_denied(make_user, namespace):
    reader = make_user("rita", reader=[NS])

    with pytest.raises(PermissionDenied) as exc_info:
        apply(reader, PutOp(A, {"n": 1}))

    assert exc_info.value.status == 403
    assert exc_info.value.pointer == "/ops/0"
    assert not Changeset.objects.exists()


def test_user_without_a_role_gets_not_found(make_user, namespace):
    stranger = make_user("sam", writer=["acme.other"])

    with pytest.raises(NotFound) as exc_info:
        apply(stranger, PutOp(A, {"n": 1}))

    assert exc_info.value.status == 404
    assert not Changeset.objects.exists()


def test_a_batch_is_denied_if_any_namespace_is_not_writable(make_user, namespace):
    user = make_user("mixed", writer=[NS], reader=["acme.billing"])

    with pytest.raises(PermissionDenied) as exc_info:
        apply(user, PutOp(A, {"n": 1}), PutOp(key("acme.billing/invoice/i"), {"n": 1}))

    assert exc_info.value.pointer == "/ops/1"
    assert not Entity.objects.exists()


def test_protected_namespace_baseline_write_needs_a_maintainer(protected_namespace, make_user):
    target = key(f"{protected_namespace.name}/policy/p")
    writer = make_user("wes", writer=[protected_namespace.name])
    maintainer = make_user("max", maintainer=[protected_namespace.name])

    with pytest.raises(PermissionDenied):
        apply(writer, PutOp(target, {"n": 1}))
    result = apply(maintainer, PutOp(target, {"n": 1}))

    assert result.changeset.author_name == "max"


def test_staff_may_write_anywhere(staff, protected_namespace, namespace):
    result = apply(
        staff,
        PutOp(key(f"{protected_namespace.name}/policy/p"), {"n": 1}),
        PutOp(A, {"n": 1}),
    )

    assert result.changeset.namespaces == sorted([protected_namespace.name, NS])


def test_check_permissions_false_skips_the_role_check(make_user, namespace):
    """For internal callers (merge, import) that authorised already."""
    nobody = make_user("nobody")

    result = apply(nobody, PutOp(A, {"n": 1}), check_permissions=False)

    assert result.changeset.author_name == "nobody"


# --- the journal ----------------------------------------------------------------------------


def test_a_baseline_changeset_gets_a_committed_journal_entry(writer, namespace, write):
    changeset = write(writer, f"{NS}/order/a", {"n": 1}).changeset

    entry = JournalEntry.objects.get(changeset=changeset)
    assert entry.phase == JournalPhase.COMMITTED  # on_commit never fires in a db test
    assert entry.created_at == changeset.at


@pytest.mark.django_db(transaction=True)
def test_after_commit_the_journal_entry_is_published_deleted_and_the_signal_fires_once(
    writer, namespace, write, publish_committed
):
    received = []

    def receiver(sender, changeset, **kw):
        # The hook runs after commit: the changeset is visible from a fresh query.
        received.append((changeset.id, Changeset.objects.filter(id=changeset.id).exists()))

    changeset_committed.connect(receiver, weak=False)
    try:
        changeset = write(writer, f"{NS}/order/a", {"n": 1}).changeset
        write(writer, f"{NS}/order/a", {"n": 1})  # unchanged: no changeset, no signal
        publish_committed()  # what the relay's task does in a worker
    finally:
        changeset_committed.disconnect(receiver)

    assert received == [(changeset.id, True)]
    assert not JournalEntry.objects.filter(changeset=changeset).exists()  # done: deleted


@pytest.mark.django_db(transaction=True)
def test_a_failed_write_sends_no_signal(writer, namespace, write, publish_committed):
    received = []
    uid = "test-failed-write"
    changeset_committed.connect(lambda **kw: received.append(kw), weak=False, dispatch_uid=uid)
    try:
        with pytest.raises(PreconditionFailed):
            apply(writer, PutOp(A, {"n": 1}), PutOp(B, {"n": 1}, if_match=3))
        publish_committed()  # what the relay's task does in a worker
    finally:
        changeset_committed.disconnect(dispatch_uid=uid)

    assert received == []
    assert not JournalEntry.objects.exists()


# --- cost: a 1,000-op batch is a bounded number of queries ------------------------------------

BATCH_QUERY_BOUND = 8  # measured 8: 1 role read, 5 statements, 2 savepoints (test-only)


def test_thousand_op_batches_run_in_a_bounded_number_of_queries(
    writer, namespace, django_assert_max_num_queries
):
    """Cost is per statement kind, not per op. Each batch gets a freshly loaded
    actor, as a request would, so the role lookup is counted too."""
    creates = [PutOp(key(f"{NS}/item/i{i:04d}"), {"i": i, "tags": ["a"]}) for i in range(1000)]
    mixed = [
        PatchOp(op.key, {"i": -1}) if i % 2 else DeleteOp(op.key) for i, op in enumerate(creates)
    ]
    actor = type(writer).objects.get(pk=writer.pk)

    with CaptureQueriesContext(connection) as measured:
        first = apply(actor, *creates)
    print(f"\n1,000 creates: {len(measured)} queries")
    actor = type(writer).objects.get(pk=writer.pk)
    with django_assert_max_num_queries(BATCH_QUERY_BOUND) as captured:
        second = apply(actor, *mixed)
    print(f"1,000 updates+deletes: {len(captured)} queries")

    assert len(measured) <= BATCH_QUERY_BOUND
    assert first.changeset.op_count == 1000
    assert second.changeset.op_count == 1000
    assert Entity.objects.filter(kind="item").count() == 500
    assert Revision.objects.filter(changeset=second.changeset, op=Op.DELETE).count() == 500
    assert_revision(
        Revision.objects.get(changeset=second.changeset, slug="i0001"),
        op=Op.UPDATE,
        before={"i": 1, "tags": ["a"]},
        after={"i": -1, "tags": ["a"]},
        before_version=1,
        after_version=2,
    )
