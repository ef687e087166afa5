"""``Idempotency-Key`` on mutating endpoints (API.md "Conventions", Idempotency).

Same principal + key + request → the first response is replayed byte for byte
with ``Idempotent-Replayed: true`` and nothing is written again; a different
request under the key → 422; a retry while the first runs → 409.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from atlas.models import IdempotencyRecord
from changesets.models import Changeset
from entities.api import views
from tests.atlas.test_errors import assert_problem

API = "/api/v1"
ENTITY = f"{API}/entities/acme.orders/event/order.placed"
BATCH = f"{API}/batch"
REPLAYED = "Idempotent-Replayed"


def keyed(key: str, **headers: str) -> dict[str, str]:
    return {"Idempotency-Key": key, **headers}


def assert_replay(first: Any, again: Any) -> None:
    """``again`` replays ``first``: same status, same bytes, same type, and says so."""
    assert again.status_code == first.status_code
    assert again.content == first.content
    assert again["Content-Type"] == first["Content-Type"]
    assert again[REPLAYED] == "true"
    assert not first.has_header(REPLAYED)


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
    token = Token.objects.create(user=user).key
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
