"""One role engine: a staff account the admin scopes to some namespaces sees and writes
exactly that through the API too (docs/security.md).

The attack this pins: a non-superuser staff user logs in through the admin's login
form, then sends its session cookie and ``X-CSRFToken`` to ``/api/v1``. The API once
treated every ``is_staff`` user as a maintainer everywhere, so the account read and
wrote namespaces the admin hid from it. Here it holds a reader grant on ``acme.orders``
only, and ``acme.secret`` (written by a superuser) must stay invisible: 404 on every
read path, 404 on every write path (403 where a path is not about one namespace), and
the same set of changesets and entities in the admin as in the API.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from changesets.models import Changeset
from tests.changesets.test_admin import LIST, NS, SECRET, make_admin, put
from tests.entities.factories import NamespaceFactory

pytestmark = pytest.mark.django_db

API = "/api/v1"
PASSWORD = "pw-for-tests-only"  # make_admin's


@pytest.fixture
def world(db):
    NamespaceFactory(name=NS)
    NamespaceFactory(name=SECRET)
    root = make_admin("root", superuser=True)
    auditor = make_admin("audrey", reader=[NS])
    mine = put(root, (f"{NS}/order/a", {"n": 1}))
    hidden = put(root, (f"{SECRET}/doc/x", {"email": "ceo@example.com"}))
    return {"root": root, "auditor": auditor, "mine": mine, "hidden": hidden}


class SessionApi:
    """The auditor's browser after the admin's login form: a session cookie plus the
    CSRF token a script would copy from the ``csrftoken`` cookie into ``X-CSRFToken``."""

    def __init__(self, username: str) -> None:
        self.client = Client(enforce_csrf_checks=True)
        self.client.get("/admin/login/")
        response = self.client.post(
            "/admin/login/?next=/admin/",
            {
                "username": username,
                "password": PASSWORD,
                "csrfmiddlewaretoken": self.client.cookies["csrftoken"].value,
                "next": "/admin/",
            },
        )
        assert response.status_code == 302 and response["Location"] == "/admin/", response
        assert "sessionid" in self.client.cookies

    def call(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        headers = {"X-CSRFToken": self.client.cookies["csrftoken"].value, **headers}
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            if isinstance(body, bytes):
                kwargs.update(data=body, content_type="application/x-ndjson")
            else:
                kwargs.update(data=body, content_type="application/json")
        return getattr(self.client, method)(API + path, **kwargs)


def test_the_session_reaches_the_api_as_the_auditor(world):
    api = SessionApi("audrey")
    response = api.call("get", f"/entities/{NS}/order/a")
    assert response.status_code == 200, response.content
    # A write the auditor's reader role does not allow is refused by role, not by CSRF.
    refused = api.call("put", f"/entities/{NS}/order/a", {"content": {"n": 2}})
    assert refused.status_code == 403, refused.content
    assert "writer" in refused.json()["detail"]


def _read_paths(hidden: Changeset) -> dict[str, str]:
    entity = f"/entities/{SECRET}/doc/x"
    return {
        "entity": entity,
        "entity as of": f"{entity}?as_of={hidden.id}",
        "history": f"{entity}/history",
        "changeset": f"/changesets/{hidden.id}",
        "revisions": f"/changesets/{hidden.id}/revisions",
        "export": f"/changesets/{hidden.id}/export",
        "namespace": f"/namespaces/{SECRET}",
        "entity list as of": f"/entities?as_of={hidden.id}",
    }


def test_every_read_path_answers_404_for_the_hidden_namespace(world):
    api = SessionApi("audrey")
    for name, path in _read_paths(world["hidden"]).items():
        response = api.call("get", path)
        assert response.status_code == 404, (name, response.status_code, response.content)
        assert response["Content-Type"] == "application/problem+json", name
        assert "ceo@example.com" not in response.content.decode(), name


def test_lists_and_the_feed_never_show_the_hidden_namespace(world):
    api = SessionApi("audrey")
    entities = api.call("get", "/entities").json()["results"]
    assert {e["namespace"] for e in entities} == {NS}
    assert api.call("get", f"/entities?namespace={SECRET}").json()["results"] == []
    changesets = api.call("get", "/changesets").json()["results"]
    assert [c["id"] for c in changesets] == [str(world["mine"].id)]
    assert api.call("get", f"/changesets?namespace={SECRET}").json()["results"] == []
    records = api.call("get", "/changes?capture=new_row").json()["records"]
    assert {r["namespace"] for r in records} == {NS}
    namespaces = api.call("get", "/namespaces").json()["results"]
    assert [n["name"] for n in namespaces] == [NS]


def test_every_write_path_is_refused_and_writes_nothing(world):
    api = SessionApi("audrey")
    hidden = world["hidden"]
    entity = f"/entities/{SECRET}/doc/x"
    put_op = {"op": "put", "namespace": SECRET, "kind": "doc", "slug": "y", "content": {}}
    ndjson = (
        b'{"schema_version": 1, "changeset_id": "0193a1c2-0000-7000-8000-000000000000",'
        b' "author": "a", "at": "2026-01-01T00:00:00Z",'
        b' "rpc": "PutEntity", "branch": "", "comment": ""}\n'
        b'{"op": "create", "namespace": "' + SECRET.encode() + b'", "kind": "doc", "slug": "z",'
        b' "before": null, "after": {"n": 1}}\n'
    )
    not_found = {
        "put": ("put", entity, {"content": {"n": 2}}),
        "patch": ("patch", entity, {"patch": {"n": 2}}),
        "delete": ("delete", entity, None),
        "batch": ("post", "/batch", {"ops": [put_op]}),
        "delete-by-query": ("post", "/delete-by-query", {"namespace": SECRET}),
        "revert": ("post", f"/changesets/{hidden.id}/revert", {}),
        "import": ("post", "/changesets/import", ndjson),
        "grant": ("put", f"/namespaces/{SECRET}/grants/user/audrey", {"role": "maintainer"}),
        "protect": ("patch", f"/namespaces/{SECRET}", {"protected": True}),
    }
    forbidden = {  # not about one namespace: superusers only
        "create namespace": ("post", "/namespaces", {"name": "audrey.own"}),
        "subscriptions": ("get", "/subscriptions", None),
        "create subscription": (
            "post",
            "/subscriptions",
            {"name": "s", "url": "https://example.com/hook", "namespaces": [SECRET]},
        ),
    }
    before = Changeset.objects.count()
    for expected, paths in ((404, not_found), (403, forbidden)):
        for name, (method, path, body) in paths.items():
            response = api.call(method, path, body)
            assert response.status_code == expected, (name, response.status_code, response.content)
            assert response["Content-Type"] == "application/problem+json", name
    assert Changeset.objects.count() == before


def test_the_admin_shows_the_same_set_as_the_api(world):
    api = SessionApi("audrey")
    admin = api.client
    api_changesets = {c["id"] for c in api.call("get", "/changesets").json()["results"]}
    admin_changesets = {str(c.pk) for c in admin.get(LIST).context["cl"].result_list}
    assert admin_changesets == api_changesets == {str(world["mine"].id)}
    api_entities = {
        (e["namespace"], e["kind"], e["slug"])
        for e in api.call("get", "/entities").json()["results"]
    }
    admin_entities = {
        (e.namespace_id, e.kind, e.slug)
        for e in admin.get("/admin/entities/entity/").context["cl"].result_list
    }
    assert admin_entities == api_entities == {(NS, "order", "a")}
    assert admin.get(f"{LIST}{world['hidden'].pk}/change/").status_code == 404
