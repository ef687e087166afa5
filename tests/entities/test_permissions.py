"""Who may do what: the role matrix, namespace isolation (invariant 8) and
authorship (invariant 5), all through the HTTP API with real token auth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from changesets.models import Changeset
from entities.services import role_grant
from entities.store import EntityKey, baseline
from tests.entities.factories import GroupFactory, NamespaceFactory, StaffFactory, UserFactory

API = "/api/v1"
UNPROTECTED, PROTECTED = "acme.orders", "acme.core"

# --- 1. the permission matrix ---------------------------------------------------
#
# One row per principal; for each kind of namespace the expected status of
#   read   = GET entity, GET history, GET /changesets/{id}, GET .../revisions
#   write  = PUT, PATCH, DELETE, POST /batch, POST /delete-by-query
#   listed = whether the namespace's entity and changeset show up in
#            GET /entities and GET /changesets (both 200; None = 401)
#
# principal             unprotected namespace     protected namespace
#                       read  write  listed       read  write  listed
# fmt: off
MATRIX: dict[str, tuple[tuple[int, int, bool | None], tuple[int, int, bool | None]]] = {
    "anonymous":        ((401, 401, None),        (401, 401, None)),
    "none":             ((404, 404, False),       (404, 404, False)),
    "reader":           ((200, 403, True),        (200, 403, True)),
    "writer":           ((200, 200, True),        (200, 403, True)),
    "maintainer":       ((200, 200, True),        (200, 200, True)),
    "superuser":        ((200, 200, True),        (200, 200, True)),
    "staff_no_grants":  ((404, 404, False),       (404, 404, False)),
    "reader_via_group": ((200, 403, True),        (200, 403, True)),
    "writer_via_group": ((200, 200, True),        (200, 403, True)),
}
# fmt: on


@dataclass
class World:
    namespace: str
    seed: EntityKey
    changeset_id: str
    client: APIClient


def _entity_url(key: EntityKey, suffix: str = "") -> str:
    return f"{API}/entities/{key.namespace}/{key.kind}/{key.slug}{suffix}"


Call = Callable[[World], Any]

# endpoint name -> (class, call)
ENDPOINTS: dict[str, tuple[str, Call]] = {
    "list_entities": ("list", lambda w: w.client.get(f"{API}/entities")),
    "get_entity": ("read", lambda w: w.client.get(_entity_url(w.seed))),
    "history": ("read", lambda w: w.client.get(_entity_url(w.seed, "/history"))),
    "put": (
        "write",
        lambda w: w.client.put(_entity_url(w.seed), {"content": {"v": 2}}, format="json"),
    ),
    "patch": (
        "write",
        lambda w: w.client.patch(_entity_url(w.seed), {"patch": {"v": 3}}, format="json"),
    ),
    "delete": ("write", lambda w: w.client.delete(_entity_url(w.seed))),
    "batch": (
        "write",
        lambda w: w.client.post(
            f"{API}/batch",
            {
                "ops": [
                    {
                        "op": "put",
                        "namespace": w.namespace,
                        "kind": "event",
                        "slug": "other",
                        "content": {"x": 1},
                    }
                ]
            },
            format="json",
        ),
    ),
    "delete_by_query": (
        "write",
        lambda w: w.client.post(
            f"{API}/delete-by-query", {"namespace": w.namespace, "kind": "event"}, format="json"
        ),
    ),
    "list_changesets": ("list", lambda w: w.client.get(f"{API}/changesets")),
    "get_changeset": ("read", lambda w: w.client.get(f"{API}/changesets/{w.changeset_id}")),
    "changeset_revisions": (
        "read",
        lambda w: w.client.get(f"{API}/changesets/{w.changeset_id}/revisions"),
    ),
}


@pytest.fixture
def principal(db, staff) -> Callable[[str, str], Any]:
    """``principal(name, namespace)`` -> a user holding that role there (None = anonymous)."""

    def make(name: str, namespace: str) -> Any:
        if name == "anonymous":
            return None
        if name == "superuser":
            return staff
        if name == "staff_no_grants":  # is_staff opens the admin, and no namespace
            return StaffFactory(username=name)
        user = UserFactory(username=name)
        if name in ("reader", "writer", "maintainer"):
            role_grant(namespace=NamespaceFactory(name=namespace), principal=user, role=name)
        elif name.endswith("_via_group"):
            group = GroupFactory(name=f"{name}-group")
            role = name.removesuffix("_via_group")
            role_grant(namespace=NamespaceFactory(name=namespace), principal=group, role=role)
            user.groups.add(group)
        return user

    return make


def _world(namespace_name: str, who: str, staff, principal, write, client_for) -> World:
    NamespaceFactory(name=namespace_name, protected=namespace_name == PROTECTED)
    seed = EntityKey(namespace_name, "event", "seed")
    result = write(staff, str(seed), {"v": 1})
    return World(
        namespace=namespace_name,
        seed=seed,
        changeset_id=str(result.changeset.id),
        client=client_for(principal(who, namespace_name)),
    )


@pytest.mark.parametrize("protected", [False, True], ids=["unprotected", "protected"])
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
@pytest.mark.parametrize("who", list(MATRIX))
def test_permission_matrix(who, endpoint, protected, staff, principal, write, client_for):
    world = _world(
        PROTECTED if protected else UNPROTECTED, who, staff, principal, write, client_for
    )
    read, write_status, listed = MATRIX[who][1 if protected else 0]
    endpoint_class, call = ENDPOINTS[endpoint]
    changesets_before = Changeset.objects.count()
    seed_before = baseline.get(world.seed)

    response = call(world)

    if endpoint_class == "list":
        assert response.status_code == (401 if listed is None else 200), response.content
        if listed is not None:
            results = response.json()["results"]
            if endpoint == "list_entities":
                found = [(e["namespace"], e["kind"], e["slug"]) for e in results]
                expected = [(world.namespace, "event", "seed")]
            else:
                found = [c["id"] for c in results]
                expected = [world.changeset_id]
            assert found == (expected if listed else [])
        return

    expected_status = read if endpoint_class == "read" else write_status
    assert response.status_code == expected_status, response.content
    if expected_status >= 400:
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["status"] == expected_status
    if endpoint_class == "write":
        if expected_status == 200:
            assert Changeset.objects.count() == changesets_before + 1
            assert response.json()["changeset"]["author"] == (who if who != "superuser" else "root")
        else:  # refused: nothing written
            assert Changeset.objects.count() == changesets_before
            assert baseline.get(world.seed) == seed_before


def test_anonymous_gets_401_with_token_challenge(client_for, namespace):
    response = client_for(None).get(f"{API}/entities")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


def test_bad_token_is_401(namespace):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert client.get(f"{API}/changesets").status_code == 401


def test_inactive_user_is_401(make_user, client_for, namespace):
    user = make_user("gone", reader=[namespace.name])
    client = client_for(user)
    user.is_active = False
    user.save()
    assert client.get(f"{API}/entities").status_code == 401


def test_write_to_missing_namespace_is_404_even_for_staff(staff, client_for):
    response = client_for(staff).put(
        f"{API}/entities/no.such/event/x", {"content": {}}, format="json"
    )
    assert response.status_code == 404


def test_role_on_another_namespace_grants_nothing_here(make_user, client_for, write, staff):
    NamespaceFactory(name="acme.orders")
    write(staff, "acme.orders/event/e1", {"v": 1})
    user = make_user("olga", maintainer=["acme.other"])
    client = client_for(user)
    assert client.get(f"{API}/entities/acme.orders/event/e1").status_code == 404
    response = client.put(f"{API}/entities/acme.orders/event/e1", {"content": {}}, format="json")
    assert response.status_code == 404


def test_group_and_direct_grant_take_the_higher_role(make_user, client_for, namespace):
    user = make_user("gwen", reader=[namespace.name])
    group = GroupFactory(name="writers")
    role_grant(namespace=namespace, principal=group, role="writer")
    user.groups.add(group)
    response = client_for(user).put(
        f"{API}/entities/{namespace.name}/event/g1", {"content": {"a": 1}}, format="json"
    )
    assert response.status_code == 201, response.content


# --- 2. namespace isolation (invariant 8) ---------------------------------------

NS_A, NS_B = "acme.orders", "acme.billing"


@pytest.fixture
def mixed(db, staff, make_user, client_for):
    """One batch touching A and B (A, B, A), plus one B-only write."""
    NamespaceFactory(name=NS_A)
    NamespaceFactory(name=NS_B)
    response = client_for(staff).post(
        f"{API}/batch",
        {
            "ops": [
                {
                    "op": "put",
                    "namespace": NS_A,
                    "kind": "event",
                    "slug": "a1",
                    "content": {"a": 1},
                },
                {
                    "op": "put",
                    "namespace": NS_B,
                    "kind": "event",
                    "slug": "b1",
                    "content": {"b": 1},
                },
                {
                    "op": "put",
                    "namespace": NS_A,
                    "kind": "event",
                    "slug": "a2",
                    "content": {"a": 2},
                },
            ]
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    mixed_id = response.json()["changeset"]["id"]
    response = client_for(staff).put(
        f"{API}/entities/{NS_B}/event/b2", {"content": {"b": 2}}, format="json"
    )
    assert response.status_code == 201
    return {
        "mixed": mixed_id,
        "b_only": response.json()["changeset"]["id"],
        "a_reader": client_for(make_user("alice", reader=[NS_A])),
        "outsider": client_for(make_user("oscar", reader=["acme.elsewhere"])),
    }


def test_a_reader_sees_only_a_ops_of_a_mixed_changeset(mixed):
    body = mixed["a_reader"].get(f"{API}/changesets/{mixed['mixed']}").json()
    assert [(op["namespace"], op["slug"]) for op in body["ops"]] == [(NS_A, "a1"), (NS_A, "a2")]
    # A partial reader sees its own count; the whole count, message and comment
    # would tell what the changeset did where it cannot look (API.md "Limits
    # and visibility").
    assert body["op_count_visible"] == 2
    assert "op_count" not in body and "message" not in body and "comment" not in body


def test_a_reader_gets_only_a_revisions(mixed):
    response = mixed["a_reader"].get(f"{API}/changesets/{mixed['mixed']}/revisions")
    assert response.status_code == 200
    rows = response.json()["results"]
    assert [(r["namespace"], r["slug"]) for r in rows] == [(NS_A, "a1"), (NS_A, "a2")]
    assert all(r["after"] != {"b": 1} for r in rows)


def test_a_reader_list_shows_mixed_changeset_with_a_ops_only(mixed):
    results = mixed["a_reader"].get(f"{API}/changesets").json()["results"]
    assert [c["id"] for c in results] == [mixed["mixed"]]  # the B-only one is absent
    assert {op["namespace"] for op in results[0]["ops"]} == {NS_A}
    assert results[0]["op_count_visible"] == 2
    assert "op_count" not in results[0] and "message" not in results[0]


def test_changeset_only_in_unreadable_namespace_is_404(mixed):
    client = mixed["a_reader"]
    assert client.get(f"{API}/changesets/{mixed['b_only']}").status_code == 404
    assert client.get(f"{API}/changesets/{mixed['b_only']}/revisions").status_code == 404


def test_changesets_namespace_filter_on_unreadable_namespace_is_empty(mixed):
    """Filtering by B must not reveal which changesets touched B."""
    response = mixed["a_reader"].get(f"{API}/changesets", {"namespace": NS_B})
    assert response.status_code == 200
    assert response.json()["results"] == []


def test_reader_of_neither_gets_404_and_empty_list(mixed):
    client = mixed["outsider"]
    for path in (f"/changesets/{mixed['mixed']}", f"/changesets/{mixed['mixed']}/revisions"):
        response = client.get(API + path)
        assert response.status_code == 404
        assert response.json()["detail"] == "No such changeset."  # same as a missing one
    assert client.get(f"{API}/changesets").json()["results"] == []
    assert client.get(f"{API}/entities").json()["results"] == []


def test_invisible_changeset_looks_exactly_like_a_missing_one(mixed):
    client = mixed["outsider"]
    hidden = client.get(f"{API}/changesets/{mixed['mixed']}").json()
    missing_id = "01900000-0000-7000-8000-000000000000"
    missing = client.get(f"{API}/changesets/{missing_id}").json()
    for body in (hidden, missing):
        body.pop("instance")
    assert hidden == missing


def test_entity_list_never_shows_b_to_an_a_reader(mixed):
    client = mixed["a_reader"]
    results = client.get(f"{API}/entities").json()["results"]
    assert [(e["namespace"], e["slug"]) for e in results] == [(NS_A, "a1"), (NS_A, "a2")]
    assert client.get(f"{API}/entities", {"namespace": NS_B}).json()["results"] == []
    assert client.get(f"{API}/entities", {"kind": "event"}).json()["next_page_token"] is None


def test_entity_list_paging_never_reaches_b(mixed):
    client = mixed["a_reader"]
    seen: list[str] = []
    params: dict[str, Any] = {"page_size": 1}
    while True:
        body = client.get(f"{API}/entities", params).json()
        seen += [e["namespace"] for e in body["results"]]
        if not body["next_page_token"]:
            break
        params["page_token"] = body["next_page_token"]
    assert seen == [NS_A, NS_A]


def test_b_entity_and_its_history_are_404_for_an_a_reader(mixed, write, staff):
    client = mixed["a_reader"]
    assert client.get(f"{API}/entities/{NS_B}/event/b1").status_code == 404
    assert client.get(f"{API}/entities/{NS_B}/event/b1/history").status_code == 404
    # also after delete (history outlives the entity)
    write(staff, f"{NS_B}/event/b1", None)
    assert client.get(f"{API}/entities/{NS_B}/event/b1/history").status_code == 404
    assert client.get(f"{API}/entities/{NS_A}/event/a1/history").status_code == 200


def test_a_entity_history_shows_the_mixed_changeset(mixed):
    rows = mixed["a_reader"].get(f"{API}/entities/{NS_A}/event/a1/history").json()["results"]
    assert [r["changeset_id"] for r in rows] == [mixed["mixed"]]


def test_batch_touching_an_unreadable_namespace_is_404_and_writes_nothing(
    make_user, client_for, staff
):
    NamespaceFactory(name=NS_A)
    NamespaceFactory(name=NS_B)
    client = client_for(make_user("wanda", writer=[NS_A]))
    before = Changeset.objects.count()
    response = client.post(
        f"{API}/batch",
        {
            "ops": [
                {"op": "put", "namespace": NS_A, "kind": "event", "slug": "a", "content": {}},
                {"op": "put", "namespace": NS_B, "kind": "event", "slug": "b", "content": {}},
            ]
        },
        format="json",
    )
    assert response.status_code == 404
    assert response.json()["pointer"] == "/ops/1"
    assert Changeset.objects.count() == before
    assert baseline.get(EntityKey(NS_A, "event", "a")) is None


def test_batch_touching_a_read_only_namespace_is_403_and_writes_nothing(make_user, client_for):
    NamespaceFactory(name=NS_A)
    NamespaceFactory(name=NS_B)
    client = client_for(make_user("wanda", writer=[NS_A], reader=[NS_B]))
    response = client.post(
        f"{API}/batch",
        {
            "ops": [
                {"op": "put", "namespace": NS_A, "kind": "event", "slug": "a", "content": {}},
                {"op": "put", "namespace": NS_B, "kind": "event", "slug": "b", "content": {}},
            ]
        },
        format="json",
    )
    assert response.status_code == 403
    assert response.json()["pointer"] == "/ops/1"
    assert Changeset.objects.count() == 0


# --- 3. the author is the authenticated principal (invariant 5) ------------------

SPOOF_HEADERS = {
    "HTTP_X_ATLAS_AUTHOR": "mallory",
    "HTTP_X_USER": "mallory",
    "HTTP_X_FORWARDED_USER": "mallory",
    "HTTP_X_REMOTE_USER": "mallory",
    "HTTP_REMOTE_USER": "mallory",
}


@pytest.fixture
def mallory(make_user, namespace):
    """A real user whose name a spoofer would like to borrow."""
    return make_user("mallory", writer=[namespace.name])


@pytest.mark.parametrize("field", ["author", "user", "author_name"])
def test_put_with_author_field_in_body_is_422_and_writes_nothing(
    field, writer, mallory, client_for, namespace
):
    response = client_for(writer).put(
        f"{API}/entities/{namespace.name}/event/e1",
        {"content": {"a": 1}, field: "mallory"},
        format="json",
    )
    assert response.status_code == 422
    assert {"pointer": f"/{field}", "detail": "Unknown field."} in response.json()["errors"]
    assert Changeset.objects.count() == 0
    assert baseline.get(EntityKey(namespace.name, "event", "e1")) is None


@pytest.mark.parametrize(
    ("body_extra", "op_extra", "pointer"),
    [({"author": "mallory"}, {}, "/author"), ({}, {"user": "mallory"}, "/ops/0/user")],
    ids=["top-level", "in-op"],
)
def test_batch_with_author_field_is_422_and_writes_nothing(
    body_extra, op_extra, pointer, writer, mallory, client_for, namespace
):
    op = {"op": "put", "namespace": namespace.name, "kind": "event", "slug": "e1"}
    response = client_for(writer).post(
        f"{API}/batch", {"ops": [{**op, "content": {}, **op_extra}], **body_extra}, format="json"
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == pointer
    assert Changeset.objects.count() == 0


def test_put_ignores_author_headers(writer, mallory, client_for, namespace):
    response = client_for(writer).put(
        f"{API}/entities/{namespace.name}/event/e1",
        {"content": {"a": 1}},
        format="json",
        **SPOOF_HEADERS,
    )
    assert response.status_code == 201, response.content
    changeset = response.json()["changeset"]
    assert changeset["author"] == "wendy"
    row = Changeset.objects.get(pk=changeset["id"])
    assert (row.author_name, row.author_id) == ("wendy", writer.pk)
    fetched = client_for(writer).get(f"{API}/changesets/{changeset['id']}").json()
    assert fetched["author"] == "wendy"


def test_batch_and_delete_by_query_ignore_author_headers(writer, mallory, client_for, namespace):
    client = client_for(writer)
    op = {"op": "put", "namespace": namespace.name, "kind": "event", "slug": "e1", "content": {}}
    response = client.post(f"{API}/batch", {"ops": [op]}, format="json", **SPOOF_HEADERS)
    assert response.status_code == 200
    assert response.json()["changeset"]["author"] == "wendy"
    response = client.post(
        f"{API}/delete-by-query", {"namespace": namespace.name}, format="json", **SPOOF_HEADERS
    )
    assert response.status_code == 200
    assert response.json()["changeset"]["author"] == "wendy"
    assert set(Changeset.objects.values_list("author_name", flat=True)) == {"wendy"}


def test_author_header_cannot_borrow_staff_powers(writer, client_for, protected_namespace, staff):
    response = client_for(writer).put(
        f"{API}/entities/{protected_namespace.name}/event/e1",
        {"content": {}},
        format="json",
        HTTP_X_ATLAS_AUTHOR=staff.username,
    )
    assert response.status_code == 404  # wendy cannot even read acme.core
    assert Changeset.objects.count() == 0


@pytest.mark.parametrize("method", ["get", "put", "post"])
def test_anonymous_with_author_header_is_401(method, settings, mallory, client_for, namespace):
    assert settings.ATLAS_DEV_AUTHOR_HEADER is False  # the default
    client = client_for(None)
    if method == "get":
        response = client.get(f"{API}/entities", **SPOOF_HEADERS)
    elif method == "put":
        response = client.put(
            f"{API}/entities/{namespace.name}/event/e1",
            {"content": {}},
            format="json",
            **SPOOF_HEADERS,
        )
    else:
        op = {"op": "put", "namespace": namespace.name, "kind": "event", "slug": "e", "content": {}}
        response = client.post(f"{API}/batch", {"ops": [op]}, format="json", **SPOOF_HEADERS)
    assert response.status_code == 401
    assert Changeset.objects.count() == 0
