"""The write path's shortcuts give exactly what the long way did.

The service serializes each image once and reuses the text for the rows and
the chain, compares with ``==`` before canonical forms, inserts the changeset,
revisions, journal entry and head hash in one statement, and hands back the
changeset built in memory. Each shortcut is pinned against the long way here.
"""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from changesets import chain
from changesets.chain.encoding import _canonical
from changesets.hooks import in_write_transaction
from changesets.models import Changeset, JournalEntry, LogHead, Op, Revision, Rpc
from changesets.ops import DeleteOp, PatchOp, PutOp, canonical, same_content
from changesets.selectors.log import previous_hash
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline

pytestmark = pytest.mark.django_db
NS = "acme.orders"


def key(slug: str) -> EntityKey:
    return EntityKey(NS, "order", slug)


TRICKY = [
    None,
    {},
    {"a": 1, "b": 1.0, "c": True, "d": None, "e": [1, 1.5, False, "x"]},
    {"z": {"y": {"x": [{}], "w": []}}, "a": 'é\u2028"\\/\n\t😀'},
    {"big": 10**30, "neg": -0.5, "tiny": 1e-20, "exp": 1.5e300},
    {"ключ": "значение", "": ""},
]


@pytest.mark.parametrize("before", TRICKY)
@pytest.mark.parametrize("after", TRICKY)
def test_revision_line_is_the_canonical_encoding_verify_recomputes(before, after):
    revision = Revision(
        branch="feature-x",
        namespace="a.b",
        kind="k_1",
        slug='s"l\\ug',
        op=Op.UPDATE,
        before=before,
        after=after,
        before_version=None if before is None else 7,
        after_version=None if after is None else 2**31 - 1,
        salt=bytes(range(16)),
    )
    line = chain.revision_line(
        namespace=revision.namespace,
        kind=revision.kind,
        slug=revision.slug,
        op=revision.op,
        before=before,
        after=after,
        salt=bytes(range(16)),
        before_version=revision.before_version,
        after_version=revision.after_version,
        branch=revision.branch,
    )
    assert line.encode() == _canonical(chain.revision_fields(revision))
    assert chain.digest_lines([line, line]) == chain.revisions_digest([revision, revision])
    assert chain.digest_lines([]) == chain.revisions_digest([])


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"n": 1}, {"n": 1.0}, False),
        ({"n": 1}, {"n": True}, False),
        ({"n": 1.0}, {"n": True}, False),
        ({"n": 0.0}, {"n": -0.0}, False),
        ({"n": [1, {"m": 1}]}, {"n": [1, {"m": True}]}, False),
        ({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}, True),
        ({"a": 1}, {"a": 2}, False),
        ({"a": [1, 2]}, {"a": [2, 1]}, False),
        (None, None, True),
    ],
)
def test_same_content_tells_json_types_apart(a, b, same):
    assert same_content(a, b) is same
    assert (canonical(a) == canonical(b)) is same


def test_a_put_of_an_equal_but_differently_typed_value_is_a_change(writer, namespace, write):
    write(writer, f"{NS}/order/a", {"n": 1, "m": [True]})
    assert write(writer, f"{NS}/order/a", {"m": [True], "n": 1}).changeset is None
    for value in ({"n": 1.0, "m": [True]}, {"n": True, "m": [True]}, {"n": 1, "m": [1]}):
        result = write(writer, f"{NS}/order/a", value)
        assert result.changeset is not None, value
        row = Revision.objects.get(changeset=result.changeset)
        assert canonical(row.after) == canonical(value)


def test_single_write_statements(staff, namespace):
    changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(key("a"), {"n": 0})], rpc=Rpc.PUT_ENTITY
    )
    with CaptureQueriesContext(connection) as captured:
        changeset_apply(
            store=baseline, actor=staff, ops=[PutOp(key("a"), {"n": 1})], rpc=Rpc.PUT_ENTITY
        )
    sql = [q["sql"] for q in captured.captured_queries]
    # lock (with the namespace check); one statement writing the entity row, drawing
    # seq and writing the log; and (tests only) the savepoint pair around the atomic
    # block inside the test's transaction. Plain get() + save() is BEGIN, SELECT,
    # UPDATE, COMMIT: the same number of round trips.
    assert len(sql) == 4, sql
    assert sum("INSERT INTO changesets_changeset" in s for s in sql) == 1
    assert sum("changesets_loghead" in s for s in sql) == 1
    assert "UPDATE entities_entity" in sql[2] and "changesets_loghead" in sql[2]


def test_the_returned_changeset_and_revisions_are_the_rows(staff, namespace):
    changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(key("a"), {"n": 0}), PutOp(key("b"), {"n": 0})],
        rpc=Rpc.BATCH_MUTATE,
    )
    result = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[
            PatchOp(key("a"), {"n": 1.5, "x": "é"}),
            DeleteOp(key("b")),
            PutOp(key("c"), {"new": [1, None]}),
        ],
        rpc=Rpc.BATCH_MUTATE,
        comment="why",
    )
    cs = result.changeset
    assert not cs._state.adding and cs._state.db == "default"
    row = Changeset.objects.get(pk=cs.pk)
    fields = [f.attname for f in Changeset._meta.concrete_fields]
    assert {f: getattr(cs, f) for f in fields} == {f: getattr(row, f) for f in fields}
    assert cs.author == staff
    assert LogHead.objects.get(pk=1).hash == cs.hash
    assert JournalEntry.objects.get(changeset=cs).phase == "committed"

    stored = list(Revision.objects.filter(changeset=cs).order_by("id"))
    columns = ["changeset_id", "seq", "branch", "at", "namespace", "kind", "slug", "op"]
    columns += ["before", "after", "before_version", "after_version"]
    assert [[getattr(r, c) for c in columns] for r in result.revisions] == [
        [getattr(r, c) for c in columns] for r in stored
    ]
    assert [r.op for r in result.revisions] == [Op.UPDATE, Op.DELETE, Op.CREATE]
    assert all(r.changeset is cs for r in result.revisions)
    assert json.dumps(stored[0].after, sort_keys=True) == '{"n": 1.5, "x": "\\u00e9"}'
    out = io.StringIO()
    call_command("verify_log", "--no-progress", stdout=out)
    assert "verified" in out.getvalue()


def test_dry_run_revisions_are_built_without_a_changeset(staff, namespace):
    result = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(key("a"), {"n": 0})],
        rpc=Rpc.PUT_ENTITY,
        dry_run=True,
    )
    assert result.changeset is None
    [revision] = result.revisions
    assert (revision.op, revision.after, revision.seq, revision.changeset_id) == (
        Op.CREATE,
        {"n": 0},
        None,
        None,
    )
    assert not Changeset.objects.exists()


def test_write_hooks_run_once_inside_the_transaction_after_the_rows_exist(staff, namespace):
    seen = []

    def hook(changeset):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT count(*) FROM changesets_changeset WHERE id = %s),"
                " (SELECT count(*) FROM changesets_revision WHERE changeset_id = %s)",
                [changeset.id, changeset.id],
            )
            seen.append((changeset.seq, connection.in_atomic_block, cursor.fetchone()))

    with in_write_transaction(hook):
        result = changeset_apply(
            store=baseline,
            actor=staff,
            ops=[PutOp(key("a"), {"n": 0}), PutOp(key("b"), {"n": 0})],
            rpc=Rpc.BATCH_MUTATE,
        )
    assert seen == [(result.changeset.seq, True, (1, 2))]


# --- the namespace check rides on the lock statement; refused callers lock nothing ------


def test_lock_statement_carries_the_namespace_check(staff, namespace, protected_namespace):
    changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(key("a"), {"n": 0})], rpc=Rpc.PUT_ENTITY
    )
    keys = [key("a"), key("b"), EntityKey("acme.core", "x", "y"), EntityKey("no.such", "x", "y")]
    with CaptureQueriesContext(connection) as captured:
        rows, namespaces = baseline.lock(keys)
    assert len(captured) == 1
    assert list(rows) == [key("a")]
    assert namespaces == {NS: False, "acme.core": True}


@pytest.mark.parametrize(
    ("roles", "protected", "branch", "locks"),
    [
        ({}, False, "", False),
        ({"reader": ["acme.orders"]}, False, "", False),
        ({"writer": ["acme.orders"]}, False, "", True),
        ({"writer": ["acme.orders"]}, True, "", False),  # protected baseline needs maintainer
        ({"writer": ["acme.orders"]}, True, "feature", True),
        ({"maintainer": ["acme.orders"]}, True, "", True),
        ({"writer": ["other.ns"]}, False, "", False),
    ],
)
def test_the_guard_locks_rows_only_where_the_actor_may_write(
    staff, namespace, make_user, roles, protected, branch, locks
):
    from entities import access

    changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(key("a"), {"n": 0})], rpc=Rpc.PUT_ENTITY
    )
    if protected:
        type(namespace).objects.filter(pk=namespace.pk).update(protected=True)
    user = make_user("guarded", **roles)
    guard = access.write_guard(type(user).objects.get(pk=user.pk), branch=branch)
    rows, namespaces = baseline.lock([key("a")], guard=guard)
    assert namespaces == {NS: protected}
    assert bool(rows) is locks
    assert guard.allows(NS, protected) is locks
    # The service's own check agrees with the guard.
    allowed = access.role_in(user, NS) >= access.required_write_role(
        type(namespace)(name=NS, protected=protected), branch=branch
    )
    assert allowed is locks


@pytest.mark.django_db(transaction=True)
def test_a_refused_writer_never_waits_for_or_holds_the_row_lock(staff, namespace, make_user):
    """A reader's write is refused without touching the row lock a writer holds."""
    import threading

    from atlas.exceptions import PermissionDenied

    changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(key("a"), {"n": 0})], rpc=Rpc.PUT_ENTITY
    )
    reader = make_user("reader", reader=[NS])
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                baseline.lock([key("a")])
                held.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with connection.cursor() as cursor:  # a lock wait fails the test instead of blocking
            cursor.execute("SET lock_timeout = '1s'")
        with pytest.raises(PermissionDenied):
            changeset_apply(
                store=baseline,
                actor=reader,
                ops=[PutOp(key("a"), {"n": 1})],
                rpc=Rpc.PUT_ENTITY,
            )
    finally:
        release.set()
        holder.join(10)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


@pytest.mark.django_db(transaction=True)
def test_a_missing_log_head_row_is_recreated_and_the_write_goes_through(staff, namespace):
    LogHead.objects.all().delete()
    cs = changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(key("a"), {"n": 0})], rpc=Rpc.PUT_ENTITY
    ).changeset
    head = LogHead.objects.get(pk=1)
    assert (head.seq, head.hash) == (cs.seq, cs.hash) and cs.seq == 1
    assert previous_hash(Changeset.objects.get()) == chain.GENESIS


def test_the_write_statements_are_prepared_once_per_connection(staff, namespace):
    """Parse and plan once per connection (atlas/db.py): each later write runs the
    lock and the log statement from PostgreSQL's prepared-statement cache."""
    for n in range(3):
        changeset_apply(
            store=baseline, actor=staff, ops=[PutOp(key("a"), {"n": n})], rpc=Rpc.PUT_ENTITY
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements")
        prepared = cursor.fetchall()
    runs = {
        "lock": [n for sql, n in prepared if "FOR UPDATE OF e" in sql],
        "log": [n for sql, n in prepared if "changesets_loghead" in sql],
    }
    assert runs["lock"] and max(runs["lock"]) >= 2, prepared
    assert runs["log"] and max(runs["log"]) >= 2, prepared
