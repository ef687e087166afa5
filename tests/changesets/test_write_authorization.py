"""Authorization rides in the write's round trips (issue 17).

A request's user object arrives without roles on it. The write does not load
them with a statement of its own: the store's lock statement reads the actor's
role rows, locks only where they allow, and hands them back (``entities.access``:
a *pending* ``WriteGuard``). So an authorized single write is BEGIN, lock,
log, COMMIT, like plain ``get()`` + ``save()``; a refused one locks nothing;
and nothing outlives the request, so a revoked grant counts on the next one.

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
def test_an_authorized_single_write_is_four_round_trips_like_get_and_save(writer, staff):
    put(staff, 0)
    put(fresh(writer), 1)  # statements are prepared on a connection's first use of them
    with round_trips() as atlas:
        put(fresh(writer), 2)  # fresh() stands for the request's token lookup
    with round_trips() as plain:
        with transaction.atomic():
            ns = Namespace.objects.get(pk=NS)
            ns.save()
    # fresh() is one round trip of its own, ahead of the write's four.
    assert len(atlas) == 1 + 4, "\n".join(atlas)
    assert "BEGIN" in atlas[1] and "COMMIT" in atlas[4], atlas
    assert len(plain) == 4, plain


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
    # ...and are cached on the user object for the rest of the request.
    with CaptureQueriesContext(connection) as captured:
        assert access.can_read(actor, NS)
    assert len(captured) == 0
