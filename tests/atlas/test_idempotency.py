"""``Idempotency-Key`` on mutating endpoints (API.md "Conventions", Idempotency).

Same principal + key + request → the first response is replayed byte for byte
with ``Idempotent-Replayed: true`` and nothing is written again; a different
request under the key → 422; a retry while the first runs → 409. An
attempt that died (its process killed, its database gone) is told apart by
the key's advisory lock (nobody holds it) and the record's changeset mark
(set inside the write's transaction): unmarked, a retry runs the request;
marked, a retry answers 409 naming the changeset and never writes again.

Every test runs twice: with session advisory locks (the default) and with
row leases (``ATLAS_DB_POOLING=transaction``); tests of the lock itself pin
``claims`` to ``session-lock``, and tests/atlas/test_pooling.py has the
lease's own.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import connection
from rest_framework.test import APIClient

from atlas.api.idempotency import lock_id
from atlas.models import IdempotencyRecord
from atlas.services import api_token_create
from changesets.hooks import in_write_transaction
from changesets.models import Changeset
from entities.api import views
from tests.atlas.test_errors import assert_problem

API = "/api/v1"
ENTITY = f"{API}/entities/acme.orders/event/order.placed"
BATCH = f"{API}/batch"
REPLAYED = "Idempotent-Replayed"
RESPONSE_LOST = "https://atlas.dev/problems/idempotency-response-lost"


class Killed(BaseException):
    """The process dies here: none of the app's ``except Exception`` clauses run.

    Unlike a real SIGKILL, ``finally`` blocks do run (the advisory lock is
    unlocked there), which leaves the database as the end of the dead
    session would: the open transaction rolled back, the lock gone.
    """


def keyed(key: str, **headers: str) -> dict[str, str]:
    return {"Idempotency-Key": key, **headers}


def assert_replay(first: Any, again: Any) -> None:
    """``again`` replays ``first``: same status, same bytes, same type, and says so."""
    assert again.status_code == first.status_code
    assert again.content == first.content
    assert again["Content-Type"] == first["Content-Type"]
    assert again[REPLAYED] == "true"
    assert not first.has_header(REPLAYED)


@pytest.fixture(autouse=True, params=["session-lock", "lease"])
def claims(request, settings) -> str:
    """How an attempt holds its key: a session advisory lock, or a lease on its row."""
    settings.ATLAS_DB_POOLING = "transaction" if request.param == "lease" else ""
    return request.param


session_locks_only = pytest.mark.parametrize("claims", ["session-lock"], indirect=True)


@pytest.fixture
def api(client_for, writer):
    return client_for(writer)


def put(client: Any, content: dict[str, Any], key: str, path: str = ENTITY, **headers: str) -> Any:
    return client.put(path, {"content": content}, format="json", headers=keyed(key, **headers))


def test_retried_put_replays_the_first_response_and_writes_once(api):
    first = put(api, {"title": "Order placed"}, "k-1")
    assert first.status_code == 201
    assert first["Content-Type"] == "application/json"
    assert first["ETag"] == '"1"'
    again = put(api, {"title": "Order placed"}, "k-1")
    assert_replay(first, again)
    assert again["ETag"] == '"1"'
    assert Changeset.objects.count() == 1
    # A plain retry without the key is a new request: identical content is "unchanged".
    plain = api.put(ENTITY, {"content": {"title": "Order placed"}}, format="json")
    assert plain.json()["status"] == "unchanged"


def test_replay_is_not_confused_by_later_writes(api, write, writer):
    first = put(api, {"v": 1}, "k-1")
    write(writer, "acme.orders/event/order.placed", {"v": 2})
    again = put(api, {"v": 1}, "k-1")
    assert_replay(first, again)
    assert again.json()["entity"]["content"] == {"v": 1}
    assert api.get(ENTITY).json()["content"] == {"v": 2}
    assert Changeset.objects.count() == 2


@pytest.mark.parametrize("method", ["patch", "delete", "batch", "delete-by-query"])
def test_every_mutating_endpoint_replays(api, write, writer, method):
    write(writer, "acme.orders/event/order.placed", {"v": 1})
    headers = keyed("k-1")

    def send() -> Any:
        if method == "patch":
            return api.patch(ENTITY, {"patch": {"w": 2}}, format="json", headers=headers)
        if method == "delete":
            return api.delete(ENTITY, headers=headers)
        if method == "batch":
            delete = {"op": "delete", "namespace": "acme.orders", "kind": "event"}
            body = {"ops": [{**delete, "slug": "order.placed"}]}
            return api.post(BATCH, body, format="json", headers=headers)
        body = {"namespace": "acme.orders"}
        return api.post(f"{API}/delete-by-query", body, format="json", headers=headers)

    first = send()
    assert first.status_code == 200, first.content
    again = send()
    # Without the key, a second delete would be a 404: the replay is the first answer.
    assert_replay(first, again)
    assert Changeset.objects.count() == 2


def test_same_key_with_a_different_body_is_422(api):
    put(api, {"v": 1}, "k-1")
    response = put(api, {"v": 2}, "k-1")
    assert_problem(response, 422, error_pointers=["/headers/Idempotency-Key"])
    assert not response.has_header(REPLAYED)
    assert api.get(ENTITY).json()["content"] == {"v": 1}
    assert Changeset.objects.count() == 1


def test_same_key_with_a_different_precondition_header_is_422(api):
    put(api, {"v": 1}, "k-1")
    assert_problem(put(api, {"v": 1}, "k-1", **{"If-Match": '"1"'}), 422)


def test_same_key_on_a_different_endpoint_is_422(api):
    put(api, {"v": 1}, "k-1")
    other = f"{API}/entities/acme.orders/event/order.paid"
    assert_problem(put(api, {"v": 1}, "k-1", path=other), 422)
    body = {"ops": []}
    assert_problem(api.post(BATCH, body, format="json", headers=keyed("k-1")), 422)
    assert Changeset.objects.count() == 1


def test_keys_are_scoped_to_the_principal(api, client_for, make_user):
    other = client_for(make_user("olga", writer=["acme.orders"]))
    mine = put(api, {"v": 1}, "shared-key")
    theirs = put(other, {"v": 2}, "shared-key")
    assert mine.status_code == 201
    assert theirs.status_code == 200
    assert theirs.json()["status"] == "updated"
    assert not theirs.has_header(REPLAYED)
    assert Changeset.objects.count() == 2
    assert [c.author_name for c in Changeset.objects.order_by("seq")] == ["wendy", "olga"]


def test_a_412_is_replayed_as_412(api, write, writer):
    write(writer, "acme.orders/event/order.placed", {"v": 1})
    first = put(api, {"v": 3}, "k-1", **{"If-Match": '"2"'})
    assert_problem(first, 412)
    # The precondition would hold now, but the key already has its answer.
    write(writer, "acme.orders/event/order.placed", {"v": 2})
    again = put(api, {"v": 3}, "k-1", **{"If-Match": '"2"'})
    assert_replay(first, again)
    assert again["Content-Type"] == "application/problem+json"
    assert api.get(ENTITY).json()["content"] == {"v": 2}


def test_a_server_error_releases_the_key_for_a_retry(api, monkeypatch):
    real = views.changeset_apply
    calls = {"n": 0}

    def flaky(**kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("transient")
        return real(**kwargs)

    monkeypatch.setattr(views, "changeset_apply", flaky)
    assert_problem(put(api, {"v": 1}, "k-1"), 500)
    assert not IdempotencyRecord.objects.exists()
    retry = put(api, {"v": 1}, "k-1")
    assert retry.status_code == 201
    assert not retry.has_header(REPLAYED)
    assert Changeset.objects.count() == 1


def test_retry_while_the_first_is_running_is_409(api, monkeypatch):
    real = views.changeset_apply
    seen: dict[str, Any] = {}

    def apply_while_retried(**kwargs: Any) -> Any:
        seen["retry"] = put(api, {"v": 1}, "k-1")
        return real(**kwargs)

    monkeypatch.setattr(views, "changeset_apply", apply_while_retried)
    first = put(api, {"v": 1}, "k-1")
    assert first.status_code == 201
    assert_problem(seen["retry"], 409)
    assert Changeset.objects.count() == 1


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there"], ids=["empty", "too-long", "control"])
def test_invalid_key_is_422(api, key):
    response = put(api, {"v": 1}, key)
    assert_problem(response, 422, error_pointers=["/headers/Idempotency-Key"])
    assert not Changeset.objects.exists()


def test_key_of_maximum_length_is_accepted(api):
    assert put(api, {"v": 1}, "x" * 255).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_requests_with_one_key_write_one_changeset(make_user, namespace):
    user = make_user("wendy", writer=[namespace.name])
    token = api_token_create(user=user, name="test")[1]
    threads_count = 10
    barrier = threading.Barrier(threads_count)
    responses: list[Any] = [None] * threads_count
    failures: list[BaseException] = []

    def send(index: int) -> None:
        try:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
            barrier.wait(timeout=30)
            responses[index] = put(client, {"title": "Order placed"}, "race-key")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert failures == []

    assert Changeset.objects.count() == 1
    statuses = sorted(r.status_code for r in responses)
    assert all(s in (201, 409) for s in statuses), statuses
    successes = [r for r in responses if r.status_code == 201]
    originals = [r for r in successes if not r.has_header(REPLAYED)]
    assert len(originals) == 1
    for replay in successes:
        assert replay.content == originals[0].content
    for conflict in (r for r in responses if r.status_code == 409):
        assert_problem(conflict, 409)
    # Once the first has finished, a retry is a replay.
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert_replay(originals[0], put(client, {"title": "Order placed"}, "race-key"))


def other_session() -> psycopg.Connection:
    """A second session on the test database (advisory locks are per database).

    Built from the test database's URL, so the embedded server's socket directory
    (in ``OPTIONS["host"]``, not ``HOST``) is honoured as well as a TCP server.
    """
    from tests.changesets.worker_helpers import database_url_for_workers

    return psycopg.connect(database_url_for_workers(), autocommit=True)


def advisory_locks_of_this_session() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def dies(monkeypatch: Any, *, after_commit: bool) -> None:
    """The next write's process is killed: inside its transaction, or right after commit."""
    real = views.changeset_apply

    def apply_and_die(**kwargs: Any) -> Any:
        if after_commit:
            real(**kwargs)
            raise Killed

        def die(changeset: Any) -> None:  # after the changeset row and the record's mark
            raise Killed

        with in_write_transaction(die):
            return real(**kwargs)

    monkeypatch.setattr(views, "changeset_apply", apply_and_die)


def test_a_retry_after_an_attempt_that_died_before_its_commit_runs_the_request(api, monkeypatch):
    dies(monkeypatch, after_commit=False)
    with pytest.raises(Killed):
        put(api, {"v": 1}, "k-1")
    monkeypatch.undo()
    dead = IdempotencyRecord.objects.get()
    assert dead.response_status is None
    assert dead.changeset_id is None, "the mark rolled back with the write"
    assert not Changeset.objects.exists()

    retry = put(api, {"v": 1}, "k-1")
    assert retry.status_code == 201, retry.content
    assert not retry.has_header(REPLAYED)
    changeset = Changeset.objects.get()
    record = IdempotencyRecord.objects.get()
    assert record.changeset_id == changeset.id
    assert_replay(retry, put(api, {"v": 1}, "k-1"))
    assert Changeset.objects.count() == 1


def test_a_retry_after_an_attempt_that_died_after_its_commit_never_writes_again(api, monkeypatch):
    dies(monkeypatch, after_commit=True)
    with pytest.raises(Killed):
        put(api, {"v": 1}, "k-1")
    monkeypatch.undo()
    changeset = Changeset.objects.get()
    assert IdempotencyRecord.objects.get().changeset_id == changeset.id

    for _ in range(2):
        retry = put(api, {"v": 1}, "k-1")
        body = assert_problem(retry, 409)
        assert body["type"] == RESPONSE_LOST
        assert body["changeset_id"] == str(changeset.id)
        assert str(changeset.id) in body["detail"]
        assert not retry.has_header(REPLAYED)
    assert_problem(put(api, {"v": 2}, "k-1"), 422)
    assert Changeset.objects.count() == 1
    assert api.get(f"{API}/changesets/{changeset.id}").status_code == 200


def test_a_server_error_after_the_write_committed_keeps_the_key(api, monkeypatch):
    real = views.changeset_apply

    def apply_then_fail(**kwargs: Any) -> Any:
        real(**kwargs)
        raise RuntimeError("rendering failed after the commit")

    monkeypatch.setattr(views, "changeset_apply", apply_then_fail)
    assert_problem(put(api, {"v": 1}, "k-1"), 500)
    monkeypatch.undo()
    # A 5xx releases the key only when nothing was written.
    changeset = Changeset.objects.get()
    assert IdempotencyRecord.objects.get().changeset_id == changeset.id
    body = assert_problem(put(api, {"v": 1}, "k-1"), 409)
    assert body["changeset_id"] == str(changeset.id)
    assert Changeset.objects.count() == 1


@session_locks_only
def test_a_record_without_a_response_is_in_progress_while_its_lock_is_held(
    api, writer, monkeypatch
):
    dies(monkeypatch, after_commit=False)
    with pytest.raises(Killed):
        put(api, {"v": 1}, "k-1")
    monkeypatch.undo()
    with other_session() as other:
        # Another session (another worker, still running the first attempt) holds the key.
        other.execute("SELECT pg_advisory_lock(%s)", [lock_id(writer.pk, "k-1")])
        busy = put(api, {"v": 1}, "k-1")
        assert_problem(busy, 409)
        assert busy.json()["type"] != RESPONSE_LOST
        assert_problem(put(api, {"v": 2}, "k-1"), 422)
        other.execute("SELECT pg_advisory_unlock_all()")
    assert put(api, {"v": 1}, "k-1").status_code == 201
    assert Changeset.objects.count() == 1


@session_locks_only
def test_the_lock_of_another_key_or_user_does_not_block(api, writer):
    with other_session() as other:
        other.execute("SELECT pg_advisory_lock(%s)", [lock_id(writer.pk + 1, "k-1")])
        other.execute("SELECT pg_advisory_lock(%s)", [lock_id(writer.pk, "k-2")])
        assert put(api, {"v": 1}, "k-1").status_code == 201


def test_no_advisory_lock_outlives_a_request(api, monkeypatch):
    assert put(api, {"v": 1}, "k-1").status_code == 201
    assert put(api, {"v": 1}, "k-1")[REPLAYED] == "true"
    assert_problem(put(api, {"v": 2}, "k-1"), 422)
    real = views.changeset_apply
    monkeypatch.setattr(views, "changeset_apply", lambda **kw: 1 / 0)
    assert_problem(put(api, {"v": 3}, "k-2"), 500)
    monkeypatch.setattr(views, "changeset_apply", real)
    assert advisory_locks_of_this_session() == 0


@session_locks_only
@pytest.mark.django_db(transaction=True)
def test_a_lock_that_cannot_be_confirmed_released_closes_the_connection(
    make_user, namespace, client_for, monkeypatch
):
    api = client_for(make_user("wendy", writer=[namespace.name]))
    real = views.changeset_apply

    def apply_and_lose_the_lock(**kwargs: Any) -> Any:
        with connection.cursor() as cursor:  # e.g. a reconnect to a new session
            cursor.execute("SELECT pg_advisory_unlock_all()")
        return real(**kwargs)

    monkeypatch.setattr(views, "changeset_apply", apply_and_lose_the_lock)
    assert put(api, {"v": 1}, "k-1").status_code == 201
    assert connection.connection is None, "closed, so no lock can leak into the next request"
    assert put(api, {"v": 1}, "k-1")[REPLAYED] == "true"
