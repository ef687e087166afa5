"""Namespaces and role grants over HTTP: superusers manage namespaces, superusers and
a namespace's maintainers its grants, everyone else reads."""

from __future__ import annotations

import re

import pytest

from entities.models import Namespace
from tests.entities.factories import GroupFactory, NamespaceFactory, StaffFactory, UserFactory

API = "/api/v1"
RFC3339_MS_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def admin(staff, client_for):
    return client_for(staff)


def _grant_url(namespace: str, principal_type: str, principal: str) -> str:
    return f"{API}/namespaces/{namespace}/grants/{principal_type}/{principal}"


def _put_entity(client, namespace: str, slug: str = "e1", content: dict | None = None):
    return client.put(
        f"{API}/entities/{namespace}/event/{slug}", {"content": content or {"a": 1}}, format="json"
    )


# --- create / read / update namespaces -------------------------------------------


def test_staff_creates_a_namespace(admin):
    response = admin.post(
        f"{API}/namespaces", {"name": "acme.new", "protected": True}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"name", "protected", "created_at"}
    assert (body["name"], body["protected"]) == ("acme.new", True)
    assert RFC3339_MS_Z.match(body["created_at"])
    assert Namespace.objects.get(name="acme.new").protected is True


def test_protected_defaults_to_false(admin):
    response = admin.post(f"{API}/namespaces", {"name": "acme.plain"}, format="json")
    assert response.status_code == 201
    assert response.json()["protected"] is False


def test_entities_can_be_written_once_the_namespace_exists(admin):
    assert _put_entity(admin, "acme.later").status_code == 404
    assert admin.post(f"{API}/namespaces", {"name": "acme.later"}, format="json").status_code == 201
    assert _put_entity(admin, "acme.later").status_code == 201


def test_duplicate_namespace_is_409(admin, namespace):
    response = admin.post(f"{API}/namespaces", {"name": namespace.name}, format="json")
    assert response.status_code == 409
    assert response["Content-Type"] == "application/problem+json"
    assert Namespace.objects.filter(name=namespace.name).count() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"name": "Acme.Orders"},
        {"name": "acme orders"},
        {"name": "acme..orders"},
        {"name": ".acme"},
        {"name": ""},
        {"name": 42},
        {"name": None},
        {},
        {"name": "acme.ok", "protected": "yes"},
        {"name": "acme.ok", "owner": "root"},
    ],
)
def test_invalid_namespace_body_is_422(admin, body):
    response = admin.post(f"{API}/namespaces", body, format="json")
    assert response.status_code == 422, response.content
    assert response.json()["errors"]
    assert not Namespace.objects.filter(name="acme.ok").exists()


def test_non_staff_cannot_create_namespaces(make_user, client_for, namespace):
    maintainer = make_user("mae", maintainer=[namespace.name])
    response = client_for(maintainer).post(f"{API}/namespaces", {"name": "acme.x"}, format="json")
    assert response.status_code == 403
    assert response["Content-Type"] == "application/problem+json"
    assert (
        client_for(None).post(f"{API}/namespaces", {"name": "acme.x"}, format="json").status_code
        == 401
    )
    assert not Namespace.objects.filter(name="acme.x").exists()


def test_namespace_list_shows_only_readable_ones(make_user, client_for, admin):
    for name in ("acme.a", "acme.b", "acme.c"):
        NamespaceFactory(name=name)
    alice = make_user("alice", reader=["acme.b"])
    group = GroupFactory(name="c-readers")
    response = admin.put(
        _grant_url("acme.c", "group", "c-readers"), {"role": "reader"}, format="json"
    )
    assert response.status_code == 201
    alice.groups.add(group)

    def names(client) -> list[str]:
        response = client.get(f"{API}/namespaces")
        assert response.status_code == 200
        return [n["name"] for n in response.json()["results"]]

    assert names(client_for(alice)) == ["acme.b", "acme.c"]
    assert names(admin) == ["acme.a", "acme.b", "acme.c"]
    assert names(client_for(UserFactory(username="nobody"))) == []
    assert client_for(None).get(f"{API}/namespaces").status_code == 401


def test_namespace_list_pages(admin):
    for i in range(5):
        NamespaceFactory(name=f"acme.n{i}")
    seen: list[str] = []
    params: dict = {"page_size": 2}
    while True:
        body = admin.get(f"{API}/namespaces", params).json()
        seen += [n["name"] for n in body["results"]]
        if body["next_page_token"] is None:
            break
        params["page_token"] = body["next_page_token"]
    assert seen == [f"acme.n{i}" for i in range(5)]


def test_get_one_namespace_is_404_when_not_readable(make_user, client_for, namespace):
    assert (
        client_for(make_user("nobody")).get(f"{API}/namespaces/{namespace.name}").status_code == 404
    )
    reader = make_user("rita", reader=[namespace.name])
    response = client_for(reader).get(f"{API}/namespaces/{namespace.name}")
    assert response.status_code == 200
    assert response.json()["name"] == namespace.name


def test_staff_patches_protection(admin, writer, client_for, namespace):
    assert _put_entity(client_for(writer), namespace.name, "before").status_code == 201
    response = admin.patch(f"{API}/namespaces/{namespace.name}", {"protected": True}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["protected"] is True
    assert Namespace.objects.get(name=namespace.name).protected is True
    # a writer now needs a maintainer for baseline writes
    assert _put_entity(client_for(writer), namespace.name, "after").status_code == 403
    response = admin.patch(
        f"{API}/namespaces/{namespace.name}", {"protected": False}, format="json"
    )
    assert response.json()["protected"] is False
    assert _put_entity(client_for(writer), namespace.name, "after").status_code == 201


@pytest.mark.parametrize("body", [{}, {"protected": "true"}, {"protected": True, "name": "x"}])
def test_bad_patch_is_422(admin, namespace, body):
    response = admin.patch(f"{API}/namespaces/{namespace.name}", body, format="json")
    assert response.status_code == 422


def test_patch_unknown_namespace_is_404(admin, db):
    response = admin.patch(f"{API}/namespaces/acme.none", {"protected": True}, format="json")
    assert response.status_code == 404


def test_non_staff_cannot_patch(make_user, client_for, namespace):
    maintainer = make_user("mae", maintainer=[namespace.name])
    response = client_for(maintainer).patch(
        f"{API}/namespaces/{namespace.name}", {"protected": True}, format="json"
    )
    assert response.status_code == 403
    assert Namespace.objects.get(name=namespace.name).protected is False


# --- grants -----------------------------------------------------------------------


def test_user_grant_writer_then_reader_then_revoke(admin, client_for, namespace):
    user = UserFactory(username="gus")
    client = client_for(user)
    assert client.get(f"{API}/entities/{namespace.name}/event/e1").status_code == 404
    assert _put_entity(client, namespace.name).status_code == 404

    response = admin.put(
        _grant_url(namespace.name, "user", "gus"), {"role": "writer"}, format="json"
    )
    # API.md: "Create answers 201 ... updates 200": a first grant creates.
    assert response.status_code == 201, response.content
    assert response.json() == {
        "namespace": namespace.name,
        "principal_type": "user",
        "principal": "gus",
        "role": "writer",
    }
    assert _put_entity(client, namespace.name).status_code == 201

    response = admin.put(
        _grant_url(namespace.name, "user", "gus"), {"role": "reader"}, format="json"
    )
    assert response.status_code == 200
    assert client.get(f"{API}/entities/{namespace.name}/event/e1").status_code == 200
    assert _put_entity(client, namespace.name, content={"a": 2}).status_code == 403

    response = admin.delete(_grant_url(namespace.name, "user", "gus"))
    assert response.status_code == 204
    assert response.content == b""
    assert client.get(f"{API}/entities/{namespace.name}/event/e1").status_code == 404
    assert client.get(f"{API}/namespaces").json()["results"] == []


def test_maintainer_grant_allows_protected_baseline_writes(admin, client_for, protected_namespace):
    UserFactory(username="max")
    client = client_for(UserFactory(username="max"))
    admin.put(_grant_url("acme.core", "user", "max"), {"role": "writer"}, format="json")
    assert _put_entity(client, "acme.core").status_code == 403
    admin.put(_grant_url("acme.core", "user", "max"), {"role": "maintainer"}, format="json")
    assert _put_entity(client, "acme.core").status_code == 201
    # downgrading removes the higher permissions, not just adds the lower ones
    admin.put(_grant_url("acme.core", "user", "max"), {"role": "writer"}, format="json")
    assert _put_entity(client, "acme.core", content={"b": 1}).status_code == 403


def test_group_grant_writer_then_reader_then_revoke(admin, client_for, namespace):
    group = GroupFactory(name="order-team")
    user = UserFactory(username="gail")
    user.groups.add(group)
    client = client_for(user)
    url = _grant_url(namespace.name, "group", "order-team")

    response = admin.put(url, {"role": "writer"}, format="json")
    assert response.status_code in (200, 201)
    assert response.json()["principal_type"] == "group"
    assert _put_entity(client, namespace.name).status_code == 201

    assert admin.put(url, {"role": "reader"}, format="json").status_code == 200
    assert client.get(f"{API}/entities/{namespace.name}/event/e1").status_code == 200
    assert _put_entity(client, namespace.name, content={"a": 2}).status_code == 403

    assert admin.delete(url).status_code == 204
    assert client.get(f"{API}/entities/{namespace.name}/event/e1").status_code == 404


def test_revoking_a_group_grant_keeps_a_direct_one(admin, client_for, namespace):
    group = GroupFactory(name="order-team")
    user = UserFactory(username="gail")
    user.groups.add(group)
    admin.put(_grant_url(namespace.name, "group", "order-team"), {"role": "writer"}, format="json")
    admin.put(_grant_url(namespace.name, "user", "gail"), {"role": "reader"}, format="json")
    client = client_for(user)
    assert _put_entity(client, namespace.name).status_code == 201
    assert admin.delete(_grant_url(namespace.name, "group", "order-team")).status_code == 204
    assert client.get(f"{API}/entities/{namespace.name}/event/e1").status_code == 200
    assert _put_entity(client, namespace.name, content={"a": 2}).status_code == 403


def test_grants_are_per_namespace(admin, client_for, namespace, protected_namespace):
    client = client_for(UserFactory(username="gus"))
    admin.put(_grant_url(namespace.name, "user", "gus"), {"role": "maintainer"}, format="json")
    assert _put_entity(client, namespace.name).status_code == 201
    assert _put_entity(client, protected_namespace.name).status_code == 404


def test_revoking_a_missing_grant_is_204(admin, namespace):
    UserFactory(username="gus")
    assert admin.delete(_grant_url(namespace.name, "user", "gus")).status_code == 204


@pytest.mark.parametrize(
    ("namespace_name", "principal_type", "principal"),
    [
        ("acme.orders", "user", "ghost"),
        ("acme.orders", "group", "ghosts"),
        ("acme.none", "user", "gus"),
        ("acme.none", "group", "team"),
        ("Bad Name", "user", "gus"),
        ("acme.orders", "robot", "gus"),
        ("acme.orders", "group", "gus"),  # a user's name is no group
        ("acme.orders", "user", "team"),  # and a group's name is no user
    ],
)
@pytest.mark.parametrize("method", ["put", "delete"])
def test_unknown_namespace_user_or_group_is_404(
    admin, namespace, method, namespace_name, principal_type, principal
):
    UserFactory(username="gus")
    GroupFactory(name="team")
    url = _grant_url(namespace_name, principal_type, principal)
    if method == "put":
        response = admin.put(url, {"role": "reader"}, format="json")
    else:
        response = admin.delete(url)
    assert response.status_code == 404, response.content
    assert response["Content-Type"] == "application/problem+json"


@pytest.mark.parametrize(
    "body",
    [
        {"role": "owner"},
        {"role": "Reader"},
        {"role": ""},
        {"role": None},
        {"role": 1},
        {},
        {"role": "reader", "extra": True},
    ],
)
def test_bad_role_is_422_and_grants_nothing(admin, client_for, namespace, body):
    user = UserFactory(username="gus")
    response = admin.put(_grant_url(namespace.name, "user", "gus"), body, format="json")
    assert response.status_code == 422, response.content
    assert response.json()["errors"]
    assert client_for(user).get(f"{API}/namespaces").json()["results"] == []


@pytest.mark.parametrize("role", ["reader", "writer"])
@pytest.mark.parametrize("method", ["put", "delete"])
def test_readers_and_writers_cannot_grant(make_user, client_for, namespace, role, method):
    """Only superusers and the namespace's maintainers manage its grants (API.md)."""
    caller = make_user("mae", **{role: [namespace.name]})
    target = UserFactory(username="gus")
    client = client_for(caller)
    url = _grant_url(namespace.name, "user", "gus")
    if method == "put":
        response = client.put(url, {"role": "maintainer"}, format="json")
    else:
        response = client.delete(_grant_url(namespace.name, "user", "mae"))
    assert response.status_code == 403
    assert client_for(target).get(f"{API}/namespaces").json()["results"] == []
    # a self-upgrade did not happen either
    assert _put_entity(client, namespace.name).status_code == (403 if role == "reader" else 201)


def test_a_maintainer_manages_grants_in_its_namespace_only(
    make_user, client_for, namespace, protected_namespace
):
    maintainer = make_user("mae", maintainer=[namespace.name], reader=[protected_namespace.name])
    UserFactory(username="gus")
    client = client_for(maintainer)
    granted = client.put(
        _grant_url(namespace.name, "user", "gus"), {"role": "writer"}, format="json"
    )
    assert granted.status_code == 201, granted.content
    assert client.delete(_grant_url(namespace.name, "user", "gus")).status_code == 204
    # readable but not maintained: 403; not readable: 404 (not visible = not found)
    elsewhere = _grant_url(protected_namespace.name, "user", "gus")
    assert client.put(elsewhere, {"role": "reader"}, format="json").status_code == 403
    NamespaceFactory(name="acme.hidden")
    hidden = _grant_url("acme.hidden", "user", "gus")
    response = client.put(hidden, {"role": "reader"}, format="json")
    assert response.status_code == 404
    assert response.json()["detail"] == "No such namespace."


def test_staff_without_grants_manages_nothing(client_for, namespace):
    staff_only = StaffFactory(username="sally")
    UserFactory(username="gus")
    client = client_for(staff_only)
    assert client.post(f"{API}/namespaces", {"name": "acme.x"}, format="json").status_code == 403
    url = _grant_url(namespace.name, "user", "gus")
    assert client.put(url, {"role": "reader"}, format="json").status_code == 404
    assert client.get(f"{API}/namespaces").json()["results"] == []


def test_anonymous_grant_is_401(client_for, namespace):
    UserFactory(username="gus")
    url = _grant_url(namespace.name, "user", "gus")
    assert client_for(None).put(url, {"role": "reader"}, format="json").status_code == 401
    assert client_for(None).delete(url).status_code == 401
