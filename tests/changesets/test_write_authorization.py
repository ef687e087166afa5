"""Authorization rides in the write's round trips (issue 17).

A request's user object arrives without roles on it. The write does not load
them with a statement of its own: the store's lock statement reads the actor's
role rows, locks only where they allow, and hands them back (``entities.access``:
a *pending* ``WriteGuard``). So an authorized single write is its read and its
log statement, which commits as it ends (``changesets.services.apply``'s
unlocked path), half of plain ``get()`` + ``save()``'s four; inside a caller's
transaction it is BEGIN, lock, log, COMMIT. A refused one locks nothing, and
nothing outlives the request, so a revoked grant counts on the next one.

Round trips are counted on the wire: libpq's trace of the connection, one per
``ReadyForQuery`` the server sends (each statement, BEGIN and COMMIT included).
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from psycopg import pq

from changesets.models import Rpc
from changesets.ops import PutOp
from changesets.services.apply import changeset_apply
from entities import access
from entities.models import Namespace
from entities.services import role_grant, role_revoke
from entities.store import EntityKey, baseline

NS = "acme.orders"
KEY = EntityKey(NS, "order", "a")


def fresh(user: User) -> User:
    """The user as a request gets it: a new object, no roles cached on it."""
    return User.objects.get(pk=user.pk)


@contextlib.contextmanager
def round_trips() -> Iterator[list[str]]:
    """The statements the server answered while inside, one per round trip, from
    libpq's trace (BEGIN and COMMIT included, unlike Django's query log)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    answered: list[str] = []
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield answered
        finally:
            pgconn.untrace()
            trace.seek(0)
            sent = ""
            for line in trace:
                fields = line.rstrip("\n").split("\t")
                if fields[0] == "F" and fields[2] in ("Query", "Parse", "Bind"):
                    sent = sent or fields[3][:60]
                if fields[0] == "B" and fields[2] == "ReadyForQuery":
                    answered.append(sent)
                    sent = ""


def put(actor: User, n: int) -> None:
    changeset_apply(store=baseline, actor=actor, ops=[PutOp(KEY, {"n": n})], rpc=Rpc.PUT_ENTITY)


@pytest.mark.django_db(transaction=True)
def test_an_authorized_single_write_is_two_round_trips_half_of_get_and_save(writer, staff):
    put(staff, 0)
    put(fresh(writer), 1)  # statements are prepared on a connection's first use of them
    with round_trips() as atlas:
        put(fresh(writer), 2)  # fresh() stands for the request's token lookup
    with round_trips() as plain, transaction.atomic():
        ns = Namespace.objects.get(pk=NS)
        ns.save()
    # fresh() is one round trip of its own, ahead of the write's two: the unlocked
    # read (with the role rows), then the log statement, which commits as it ends.
    assert len(atlas) == 1 + 2, "\n".join(atlas)
    assert not any("BEGIN" in s or "COMMIT" in s for s in atlas), atlas
    assert len(plain) == 4, plain


@pytest.mark.django_db(transaction=True)
def test_in_a_callers_transaction_it_is_the_locked_four(writer, staff):
    put(staff, 0)
    with transaction.atomic():
        put(fresh(writer), 1)  # prepares the locked path's statements
    with round_trips() as atlas, transaction.atomic():
        put(fresh(writer), 2)
    # BEGIN, the token lookup's stand-in, then SAVEPOINT, lock, log, RELEASE, and
    # the caller's COMMIT.
    assert len(atlas) == 1 + 1 + 4 + 1, "\n".join(atlas)
    assert "BEGIN" in atlas[0] and "COMMIT" in atlas[-1], atlas
    assert "SAVEPOINT" in atlas[2] and "RELEASE" in atlas[5], atlas


def test_the_role_rows_ride_in_the_lock_statement(writer, staff):
    put(staff, 0)
    actor = fresh(writer)
    with CaptureQueriesContext(connection) as captured:
        put(actor, 1)
    sql = [q["sql"] for q in captured.captured_queries]
    # SAVEPOINT and RELEASE stand for BEGIN and COMMIT inside the test's transaction.
    assert len(sql) == 4, sql
    assert "guardian_userobjectpermission" in sql[1] and "FOR UPDATE OF e" in sql[1]
    assert "changesets_loghead" in sql[2]


def test_the_lock_statement_reads_only_the_keys_namespaces_grants(make_user, staff, namespace):
    put(staff, 0)
    user = fresh(make_user("many", writer=[NS, "acme.a", "acme.b"], reader=["acme.c"]))
    guard = access.write_guard(user, branch="")
    rows, _ = baseline.lock([KEY], guard=guard)
    assert list(rows) == [KEY]
    learned = guard.learned_roles()
    assert learned is not None and learned.grants == {NS: access.Role.WRITER}
    assert not hasattr(user, "_atlas_namespace_roles")  # a partial table is never cached
    assert access.readable_namespaces(user) == ["acme.a", "acme.b", "acme.c", NS]


def test_an_authorized_put_over_http_is_the_token_lookup_and_the_four(writer, staff, client_for):
    put(staff, 0)
    client = client_for(writer)
    url = f"/api/v1/entities/{NS}/order/a"
    assert client.put(url, {"content": {"n": 1}}, format="json").status_code == 200
    with CaptureQueriesContext(connection) as captured:
        response = client.put(url, {"content": {"n": 2}}, format="json")
    assert response.status_code == 200, response.content
    sql = [q["sql"] for q in captured.captured_queries]
    assert len(sql) == 1 + 4, sql  # token (joined to its user); SAVEPOINT, lock, log, RELEASE
    assert sum("guardian_" in s for s in sql) == 1 and "FOR UPDATE OF e" in sql[2], sql


# --- a grant changed between two requests counts on the second ---------------------------


@pytest.mark.parametrize(
    ("change", "answer"),
    [("revoke", 404), ("reader", 403), ("maintainer-protected", 403), ("group-revoke", 404)],
)
def test_a_grant_changed_takes_effect_on_the_very_next_request(
    writer, staff, client_for, namespace, change, answer
):
    """Two requests with one token: the first writes, the grant changes, the
    second is refused with the answer the new grant gives (API.md: a caller who
    cannot read the namespace gets 404, a reader who cannot write 403)."""
    from django.contrib.auth.models import Group

    put(staff, 0)
    if change == "group-revoke":  # the role comes through a group only
        role_revoke(namespace=namespace, principal=writer)
        group = Group.objects.create(name="writers")
        role_grant(namespace=namespace, principal=group, role="writer")
        writer.groups.add(group)
    client = client_for(writer)
    url = f"/api/v1/entities/{NS}/order/a"
    first = client.put(url, {"content": {"n": 1}}, format="json")
    assert first.status_code == 200, first.content
    if change == "revoke":
        role_revoke(namespace=namespace, principal=User.objects.get(pk=writer.pk))
    elif change == "reader":
        role_grant(namespace=namespace, principal=User.objects.get(pk=writer.pk), role="reader")
    elif change == "maintainer-protected":
        Namespace.objects.filter(pk=NS).update(protected=True)
    else:
        writer.groups.clear()
    second = client.put(url, {"content": {"n": 2}}, format="json")
    assert second.status_code == answer, second.content
    assert second["Content-Type"].startswith("application/problem+json")
    assert baseline.get(KEY).content == {"n": 1}


# --- a refused caller locks nothing -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("role", [None, "reader"])
def test_a_refused_lock_statement_never_blocks_a_writer_of_the_same_key(
    staff, writer, make_user, role
):
    """The refused caller's lock statement runs, and its transaction stays open;
    a writer of the same key goes through meanwhile, so it holds no row lock."""
    put(staff, 0)
    refused = fresh(make_user("rita", **({role: [NS]} if role else {})))
    ran, release, seen = threading.Event(), threading.Event(), {}

    def refused_lock() -> None:
        try:
            with transaction.atomic():
                guard = access.write_guard(refused, branch="")
                assert guard.pending is refused  # the roles ride in the lock statement
                seen["rows"], seen["namespaces"] = baseline.lock([KEY], guard=guard)
                ran.set()
                release.wait(10)
        finally:
            ran.set()
            connection.close()

    thread = threading.Thread(target=refused_lock)
    thread.start()
    try:
        assert ran.wait(10)
        assert seen == {"rows": {}, "namespaces": {NS: False}}
        assert access.role_in(refused, NS) == (access.Role.READER if role else access.Role.NONE)
        with connection.cursor() as cursor:  # a lock wait fails the test instead of blocking
            cursor.execute("SET lock_timeout = '1s'")
        put(fresh(writer), 1)
    finally:
        release.set()
        thread.join(10)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert baseline.get(KEY).content == {"n": 1}


@pytest.mark.parametrize("known", [False, True])
@pytest.mark.parametrize(
    ("roles", "protected", "branch", "locks"),
    [
        ({}, False, "", False),
        ({"reader": [NS]}, False, "", False),
        ({"writer": [NS]}, False, "", True),
        ({"writer": [NS]}, True, "", False),
        ({"writer": [NS]}, True, "feature", True),
        ({"maintainer": [NS]}, True, "", True),
        ({"writer": ["other.ns"]}, False, "", False),
    ],
)
def test_pending_and_known_guards_lock_the_same_rows(
    staff, namespace, make_user, known, roles, protected, branch, locks
):
    put(staff, 0)
    if protected:
        Namespace.objects.filter(pk=NS).update(protected=True)
    user = fresh(make_user("guarded", **roles))
    if known:
        access.roles_for(user)
    guard = access.write_guard(user, branch=branch)
    assert (guard.pending is None) is known
    with CaptureQueriesContext(connection) as captured:
        rows, _ = baseline.lock([KEY], guard=guard)
        guarded = guard.allows(NS, protected)
    assert len(captured) == 1  # the lock; the roles came with it or were known
    # ...and agree with the engine's answer from the user's whole role table.
    allowed = access.role_in(fresh(user), NS) >= access.required_write_role(
        Namespace(name=NS, protected=protected), branch=branch
    )
    assert bool(rows) is locks is allowed is guarded


@pytest.mark.parametrize(
    ("codename", "locks"), [("write_namespace", True), ("read_namespace", False)]
)
def test_a_global_permission_counts_in_the_lock_statement(staff, namespace, codename, locks):
    """A global ``entities.*_namespace`` permission is a floor in every namespace,
    in the lock statement's role rows as in the whole role table."""
    from django.contrib.auth.models import Permission

    put(staff, 0)
    user = User.objects.create_user("global")
    user.user_permissions.add(Permission.objects.get(codename=codename))
    guard = access.write_guard(fresh(user), branch="")
    rows, _ = baseline.lock([KEY], guard=guard)
    assert bool(rows) is locks
    assert guard.learned_roles().floor == access.roles_for(fresh(user)).floor
