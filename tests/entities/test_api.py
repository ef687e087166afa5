"""The entity HTTP API: writes, conditional requests, history, listing, batch, delete-by-query.

Everything goes through ``APIClient`` with token auth and JSON bodies, and is
checked against API.md ("Entities", "Batch and query writes").
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from changesets.models import Changeset, Revision
from tests.atlas.test_errors import assert_problem

API = "/api/v1"
BATCH = f"{API}/batch"
DELETE_BY_QUERY = f"{API}/delete-by-query"
ENTITIES = f"{API}/entities"


def url(slug: str = "order.placed", namespace: str = "acme.orders", kind: str = "event") -> str:
    return f"{ENTITIES}/{namespace}/{kind}/{slug}"


ENTITY = url()
ENTITY_FIELDS = [
    "namespace",
    "kind",
    "slug",
    "content",
    "version",
    "created_at",
    "updated_at",
    "changeset_id",
]
HISTORY = f"{ENTITY}/history"


def put(client: Any, content: Any, path: str = ENTITY, **kwargs: Any) -> Any:
    return client.put(path, {"content": content}, format="json", **kwargs)


def op(name: str, slug: str, **fields: Any) -> dict[str, Any]:
    """A batch op on ``acme.orders/event/<slug>`` unless ``fields`` say otherwise."""
    return {"op": name, "namespace": "acme.orders", "kind": "event", "slug": slug, **fields}


def batch(client: Any, *ops: dict[str, Any], **body: Any) -> Any:
    return client.post(BATCH, {"ops": list(ops), **body}, format="json")


def assert_write(
    response: Any,
    status: str,
    *,
    version: int | None = None,
    content: dict[str, Any] | None = None,
    rpc: str | None = None,
) -> dict[str, Any]:
    """Assert a single-entity write response (API.md "Write responses") and return its body.

    ``created`` answers 201, the rest 200; ``unchanged`` has no changeset;
    ``deleted`` has no entity; any entity answer carries ``ETag: "<version>"``
    and names the changeset that last wrote it.
    """
    assert response.status_code == (201 if status == "created" else 200), response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"entity", "changeset", "status"}
    assert body["status"] == status
    entity, changeset = body["entity"], body["changeset"]
    if status == "deleted":
        assert entity is None
        assert not response.has_header("ETag")
    else:
        assert entity["version"] == version
        assert response["ETag"] == f'"{version}"'
        if content is not None:
            assert entity["content"] == content
    if status == "unchanged":
        assert changeset is None
    else:
        assert changeset["rpc"] == rpc
        assert changeset["message"] == f"{rpc}: 1 change(s)"
        assert changeset["op_count"] == 1
        [change] = changeset["ops"]
        assert (
            change["op"] == {"created": "create", "updated": "update", "deleted": "delete"}[status]
        )
        assert change["after_version"] == version
        if entity is not None:
            assert entity["changeset_id"] == changeset["id"]
    return body


def keys(results: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(e["namespace"], e["kind"], e["slug"]) for e in results]


def walk(client: Any, path: str, **params: Any) -> list[list[dict[str, Any]]]:
    """Every page of a listing, following ``next_page_token`` to the end."""
    pages: list[list[dict[str, Any]]] = []
    token = None
    while True:
        query = {**params, **({"page_token": token} if token else {})}
        response = client.get(path, query)
        assert response.status_code == 200, response.content
        body = response.json()
        pages.append(body["results"])
        token = body["next_page_token"]
        if token is None:
            return pages


@pytest.fixture
def api(client_for, writer):
    return client_for(writer)


@pytest.fixture
def existing(write, writer):
    """``acme.orders/event/order.placed`` at version 1."""
    return write(writer, "acme.orders/event/order.placed", {"title": "Order placed"})


# --- PUT / PATCH / DELETE / GET -------------------------------------------------------------


def test_put_creates_entity_with_etag_1(api):
    response = api.put(
        ENTITY, {"content": {"title": "Order placed"}, "comment": "first"}, format="json"
    )
    body = assert_write(
        response, "created", version=1, content={"title": "Order placed"}, rpc="PutEntity"
    )
    entity, changeset = body["entity"], body["changeset"]
    assert (entity["namespace"], entity["kind"], entity["slug"]) == (
        "acme.orders",
        "event",
        "order.placed",
    )
    assert entity["created_at"] == entity["updated_at"]
    assert entity["created_at"].endswith("Z") and len(entity["created_at"]) == 24
    assert changeset["author"] == "wendy"
    assert changeset["comment"] == "first"
    assert changeset["branch"] == ""
    assert changeset["ops"] == [
        {
            "namespace": "acme.orders",
            "kind": "event",
            "slug": "order.placed",
            "op": "create",
            "before_version": None,
            "after_version": 1,
            "changed": ["/title"],
        }
    ]
    got = api.get(ENTITY)
    assert got.status_code == 200
    assert got["ETag"] == '"1"'
    assert got.json() == entity


def test_put_replaces_existing_entity(api, existing):
    body = assert_write(put(api, {"summary": "replaced"}), "updated", version=2, rpc="PutEntity")
    assert body["entity"]["content"] == {"summary": "replaced"}
    assert body["changeset"]["ops"][0]["before_version"] == 1
    assert api.get(ENTITY).json()["content"] == {"summary": "replaced"}


def test_identical_put_is_unchanged_and_writes_no_changeset(api):
    put(api, {"title": "Order placed", "tags": ["a", "b"], "n": 1})
    before = Changeset.objects.count()
    # Key order is not content: the same object in another order is unchanged.
    response = put(api, {"n": 1, "tags": ["a", "b"], "title": "Order placed"})
    body = assert_write(response, "unchanged", version=1)
    assert body["entity"]["content"] == {"title": "Order placed", "tags": ["a", "b"], "n": 1}
    assert Changeset.objects.count() == before


def test_put_tells_true_from_1(api):
    put(api, {"flag": 1})
    assert_write(put(api, {"flag": True}), "updated", version=2, rpc="PutEntity")
    assert_write(put(api, {"flag": 1.5}), "updated", version=3, rpc="PutEntity")


def test_patch_is_an_rfc7396_merge(api):
    put(
        api,
        {"title": "Order placed", "meta": {"a": 1, "b": 2, "deep": {"x": 1}}, "tags": ["x"]},
    )
    patch = {"title": None, "meta": {"b": None, "c": 3, "deep": {"y": 2}}, "tags": ["y"], "new": {}}
    response = api.patch(ENTITY, {"patch": patch, "comment": "tidy"}, format="json")
    body = assert_write(response, "updated", version=2, rpc="PatchEntity")
    assert body["entity"]["content"] == {
        "meta": {"a": 1, "c": 3, "deep": {"x": 1, "y": 2}},
        "tags": ["y"],
        "new": {},
    }
    assert body["changeset"]["comment"] == "tidy"


def test_patch_that_changes_nothing_is_unchanged(api, existing):
    before = Changeset.objects.count()
    response = api.patch(ENTITY, {"patch": {"title": "Order placed", "gone": None}}, format="json")
    assert_write(response, "unchanged", version=1)
    assert Changeset.objects.count() == before


def test_patch_of_missing_entity_is_404(api, namespace):
    assert_problem(api.patch(ENTITY, {"patch": {"a": 1}}, format="json"), 404)
    assert not Changeset.objects.exists()


def test_delete_answers_null_entity_and_then_get_is_404(api, existing):
    body = assert_write(api.delete(ENTITY), "deleted", rpc="DeleteEntity")
    assert body["changeset"]["ops"][0]["before_version"] == 1
    assert_problem(api.get(ENTITY), 404)
    assert_problem(api.delete(ENTITY), 404)


def test_delete_accepts_a_comment(api, existing):
    response = api.delete(ENTITY, {"comment": "retired"}, format="json")
    assert (
        assert_write(response, "deleted", rpc="DeleteEntity")["changeset"]["comment"] == "retired"
    )


def test_get_of_missing_entity_is_404(api, namespace):
    assert_problem(api.get(ENTITY), 404)


def test_write_into_missing_namespace_is_404(client_for, staff):
    response = put(client_for(staff), {"a": 1}, path=url(namespace="no.such"))
    assert_problem(response, 404)


def test_reader_cannot_write_and_gets_403(client_for, make_user, existing):
    reader = client_for(make_user("rita", reader=["acme.orders"]))
    assert reader.get(ENTITY).status_code == 200
    assert_problem(put(reader, {"a": 1}), 403)
    assert_problem(reader.patch(ENTITY, {"patch": {"a": 1}}, format="json"), 403)
    assert_problem(reader.delete(ENTITY), 403)
    assert Changeset.objects.count() == 1


def test_unreadable_namespace_is_not_found_for_reads_and_writes(client_for, make_user, existing):
    stranger = client_for(make_user("sam", writer=["acme.billing"]))
    assert_problem(stranger.get(ENTITY), 404)
    assert_problem(stranger.get(HISTORY), 404)
    assert_problem(put(stranger, {"a": 1}), 404)
    assert stranger.get(ENTITIES).json()["results"] == []


def test_protected_namespace_baseline_needs_a_maintainer(
    client_for, make_user, protected_namespace
):
    path = url(namespace=protected_namespace.name)
    writer = client_for(make_user("will", writer=[protected_namespace.name]))
    assert_problem(put(writer, {"a": 1}, path=path), 403)
    maintainer = client_for(make_user("mia", maintainer=[protected_namespace.name]))
    assert_write(put(maintainer, {"a": 1}, path=path), "created", version=1, rpc="PutEntity")


# --- conditional requests ------------------------------------------------------------------------


@pytest.mark.parametrize("if_match", ['"1"', 'W/"1"', "*", '"7", "1"'])
def test_put_with_current_if_match_succeeds(api, existing, if_match):
    response = put(api, {"title": "v2"}, headers={"If-Match": if_match})
    assert_write(response, "updated", version=2, rpc="PutEntity")


@pytest.mark.parametrize("if_match", ['"2"', 'W/"0"', '"3", W/"4"'])
def test_put_with_stale_if_match_is_412(api, existing, if_match):
    assert_problem(put(api, {"title": "v2"}, headers={"If-Match": if_match}), 412)
    assert api.get(ENTITY).json()["content"] == {"title": "Order placed"}
    assert Changeset.objects.count() == 1


@pytest.mark.parametrize("if_match", ['"1"', "*"])
def test_if_match_on_missing_entity_is_412(api, namespace, if_match):
    assert_problem(put(api, {"a": 1}, headers={"If-Match": if_match}), 412)
    response = api.patch(ENTITY, {"patch": {"a": 1}}, format="json", headers={"If-Match": if_match})
    assert_problem(response, 412)
    assert_problem(api.delete(ENTITY, headers={"If-Match": if_match}), 412)
    assert not Changeset.objects.exists()


def test_patch_and_delete_honour_if_match(api, existing):
    stale = {"If-Match": '"9"'}
    assert_problem(api.patch(ENTITY, {"patch": {"a": 1}}, format="json", headers=stale), 412)
    assert_problem(api.delete(ENTITY, headers=stale), 412)
    response = api.patch(ENTITY, {"patch": {"a": 1}}, format="json", headers={"If-Match": '"1"'})
    assert_write(response, "updated", version=2, rpc="PatchEntity")
    assert_write(api.delete(ENTITY, headers={"If-Match": 'W/"2"'}), "deleted", rpc="DeleteEntity")


def test_if_none_match_star_is_create_only(api, namespace):
    response = put(api, {"a": 1}, headers={"If-None-Match": "*"})
    assert_write(response, "created", version=1, rpc="PutEntity")
    assert_problem(put(api, {"a": 2}, headers={"If-None-Match": "*"}), 412)
    assert api.get(ENTITY).json()["content"] == {"a": 1}


def test_if_none_match_other_than_star_on_put_is_422(api, existing):
    assert_problem(put(api, {"a": 2}, headers={"If-None-Match": '"1"'}), 422)


@pytest.mark.parametrize("if_none_match", ['"1"', 'W/"1"', '"5", "1"', "*"])
def test_get_with_current_etag_is_304(api, existing, if_none_match):
    response = api.get(ENTITY, headers={"If-None-Match": if_none_match})
    assert response.status_code == 304
    assert response["ETag"] == '"1"'
    assert response.content == b""


def test_get_with_stale_etag_is_200(api, existing):
    put(api, {"title": "v2"})
    response = api.get(ENTITY, headers={"If-None-Match": '"1"'})
    assert response.status_code == 200
    assert response["ETag"] == '"2"'


def test_recreated_entity_continues_versions_so_an_old_etag_never_matches(api, existing):
    api.delete(ENTITY)
    assert_problem(put(api, {"again": True}, headers={"If-Match": '"1"'}), 412)
    assert_write(put(api, {"again": True}), "created", version=2, rpc="PutEntity")


# --- history -----------------------------------------------------------------------------------


def test_history_is_newest_first_and_survives_delete(api):
    put(api, {"v": 1})
    put(api, {"v": 2})
    api.delete(ENTITY)
    assert_problem(api.get(ENTITY), 404)
    response = api.get(HISTORY)
    assert response.status_code == 200
    body = response.json()
    assert body["next_page_token"] is None
    rows = body["results"]
    assert [(r["op"], r["before_version"], r["after_version"]) for r in rows] == [
        ("delete", 2, None),
        ("update", 1, 2),
        ("create", None, 1),
    ]
    assert [(r["before"], r["after"]) for r in rows] == [
        ({"v": 2}, None),
        ({"v": 1}, {"v": 2}),
        (None, {"v": 1}),
    ]
    assert [r["rpc"] for r in rows] == ["DeleteEntity", "PutEntity", "PutEntity"]
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs, reverse=True)
    assert {r["author"] for r in rows} == {"wendy"}
    assert all(r["branch"] == "" and r["slug"] == "order.placed" for r in rows)


def test_history_of_entity_never_written_is_404(api, namespace):
    assert_problem(api.get(HISTORY), 404)


def test_history_pages_walk_every_revision_once_while_writes_land(api, write, writer):
    for n in range(1, 6):
        put(api, {"n": n})
    seen: list[int] = []
    response = api.get(HISTORY, {"page_size": 2})
    while True:
        assert response.status_code == 200, response.content
        body = response.json()
        assert len(body["results"]) <= 2
        seen.extend(r["after_version"] for r in body["results"])
        if body["next_page_token"] is None:
            break
        # New revisions land between pages; the walk must neither repeat nor skip.
        write(writer, "acme.orders/event/order.placed", {"n": 100 + len(seen)})
        response = api.get(HISTORY, {"page_size": 2, "page_token": body["next_page_token"]})
    assert seen == [5, 4, 3, 2, 1]
    assert Revision.objects.filter(slug="order.placed").count() == 7


# --- listing --------------------------------------------------------------------------------


@pytest.fixture
def catalogue(make_user, write):
    """Entities across two namespaces and kinds, written out of order; returns the writer."""
    author = make_user("alice", writer=["acme.orders", "acme.billing"])
    for path in [
        "acme.orders/event/b",
        "acme.orders/event/a_1",
        "acme.orders/event/ab1",
        "acme.orders/event/a.1",
        "acme.orders/event/B",
        "acme.orders/command/z",
        "acme.billing/event/invoice.paid",
        "acme.billing/command/charge",
        "acme.orders/event/a-1",
    ]:
        write(author, path, {"path": path})
    return author


def test_list_is_ordered_by_namespace_kind_slug(client_for, catalogue):
    response = client_for(catalogue).get(ENTITIES)
    assert response.status_code == 200
    body = response.json()
    assert body["next_page_token"] is None
    listed = keys(body["results"])
    assert listed == sorted(listed)
    assert len(listed) == 9
    assert listed[:2] == [
        ("acme.billing", "command", "charge"),
        ("acme.billing", "event", "invoice.paid"),
    ]
    first = body["results"][0]
    assert set(first) == set(ENTITY_FIELDS)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"namespace": "acme.billing"}, ["charge", "invoice.paid"]),
        ({"kind": "command"}, ["charge", "z"]),
        ({"namespace": "acme.orders", "kind": "event"}, ["B", "a-1", "a.1", "a_1", "ab1", "b"]),
        ({"slug_prefix": "a"}, ["a-1", "a.1", "a_1", "ab1"]),
        ({"slug_prefix": "a_"}, ["a_1"]),
        ({"slug_prefix": "a%"}, []),
        ({"slug_prefix": "%"}, []),
        ({"slug_prefix": "_"}, []),
        ({"namespace": "acme", "kind": "event"}, []),
        ({"namespace": "no.such"}, []),
    ],
)
def test_list_filters(client_for, catalogue, params, expected):
    response = client_for(catalogue).get(ENTITIES, params)
    assert response.status_code == 200, response.content
    assert [e["slug"] for e in response.json()["results"]] == expected


def test_list_pages_by_token_without_duplicates_or_gaps(client_for, catalogue, write):
    client = client_for(catalogue)
    everything = keys(client.get(ENTITIES).json()["results"])
    first = client.get(ENTITIES, {"page_size": 4}).json()
    assert keys(first["results"]) == everything[:4]
    # A key sorting before the cursor and one after it land mid-walk.
    write(catalogue, "acme.billing/aaa/early", {"late": True})
    write(catalogue, "acme.orders/event/zz", {"late": True})
    rest: list[tuple[str, str, str]] = []
    token = first["next_page_token"]
    while token:
        page = client.get(ENTITIES, {"page_size": 4, "page_token": token}).json()
        assert len(page["results"]) <= 4
        rest.extend(keys(page["results"]))
        token = page["next_page_token"]
    assert rest == everything[4:] + [("acme.orders", "event", "zz")]


def test_list_pages_keep_their_filters(client_for, catalogue):
    pages = walk(
        client_for(catalogue), ENTITIES, page_size=2, namespace="acme.orders", kind="event"
    )
    assert [len(p) for p in pages] == [2, 2, 2]
    assert [e["slug"] for p in pages for e in p] == ["B", "a-1", "a.1", "a_1", "ab1", "b"]


def test_page_size_above_the_maximum_is_clamped(client_for, catalogue):
    response = client_for(catalogue).get(ENTITIES, {"page_size": 100_000})
    assert response.status_code == 200
    assert len(response.json()["results"]) == 9


def test_list_shows_only_readable_namespaces(client_for, make_user, catalogue):
    reader = client_for(make_user("rita", reader=["acme.billing"]))
    listed = keys(reader.get(ENTITIES).json()["results"])
    assert listed == [
        ("acme.billing", "command", "charge"),
        ("acme.billing", "event", "invoice.paid"),
    ]
    assert reader.get(ENTITIES, {"namespace": "acme.orders"}).json()["results"] == []


# --- batch ----------------------------------------------------------------------------------


def test_batch_applies_ops_in_order_and_later_ops_see_earlier_ones(api, write, writer):
    write(writer, "acme.orders/event/old", {"old": True})
    response = batch(
        api,
        op("put", "a", content={"v": 1}, if_none_match="*"),
        op("patch", "a", patch={"w": 2}),
        op("delete", "old", if_match="*"),
        op("put", "a", content={"v": 1, "w": 2}, if_match=1),
        comment="migrate order events",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is False
    # A key's version moves once per changeset (one revision per key, DESIGN invariant 4),
    # so every op on "a" reports, and if_match compares against, the version it lands at.
    assert body["results"] == [
        {"pointer": "/ops/0", "status": "created", "version": 1},
        {"pointer": "/ops/1", "status": "updated", "version": 1},
        {"pointer": "/ops/2", "status": "deleted", "version": None},
        {"pointer": "/ops/3", "status": "unchanged", "version": 1},
    ]
    changeset = body["changeset"]
    assert changeset["rpc"] == "BatchMutate"
    assert changeset["comment"] == "migrate order events"
    assert changeset["op_count"] == 2
    assert changeset["message"] == "BatchMutate: 2 change(s)"
    assert sorted(
        (o["slug"], o["op"], o["before_version"], o["after_version"]) for o in changeset["ops"]
    ) == [
        ("a", "create", None, 1),
        ("old", "delete", 1, None),
    ]
    a = api.get(url("a"))
    assert (a.json()["content"], a["ETag"]) == ({"v": 1, "w": 2}, '"1"')
    assert_problem(api.get(url("old")), 404)
    assert Changeset.objects.count() == 2


def test_batch_key_created_and_deleted_in_one_batch_leaves_no_trace(api, namespace):
    # The delete's if_match holds only because it sees the create before it.
    response = batch(
        api,
        op("put", "tmp", content={"tmp": True}, if_none_match="*"),
        op("delete", "tmp", if_match=1),
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert [r["pointer"] for r in body["results"]] == ["/ops/0", "/ops/1"]
    assert body["changeset"] is None
    assert_problem(api.get(url("tmp")), 404)
    assert_problem(api.get(f"{url('tmp')}/history"), 404)
    assert not Changeset.objects.exists()


def test_batch_of_only_no_op_changes_writes_no_changeset(api, existing):
    response = batch(api, op("put", "order.placed", content={"title": "Order placed"}))
    assert response.status_code == 200
    assert response.json()["changeset"] is None
    assert response.json()["results"] == [
        {"pointer": "/ops/0", "status": "unchanged", "version": 1}
    ]
    assert batch(api).json() == {"changeset": None, "results": [], "dry_run": False}
    assert Changeset.objects.count() == 1


@pytest.fixture
def mixed_author(make_user, write, namespace):
    """Writes acme.orders, where ``event/there`` is at version 1; only reads acme.reads."""
    user = make_user("bea", writer=["acme.orders"], reader=["acme.reads"])
    write(user, "acme.orders/event/there", {"v": 1})
    return user


@pytest.mark.parametrize(
    ("failing", "status", "pointer"),
    [
        (op("put", "there", content={"v": 2}, if_match=9), 412, "/ops/1"),
        (op("put", "first", content={"v": 2}, if_none_match="*"), 412, "/ops/1"),
        (op("put", "missing", content={}, if_match="*"), 412, "/ops/1"),
        (op("patch", "missing", patch={"a": 1}, if_match=1), 412, "/ops/1"),
        (op("delete", "missing", if_match=1), 412, "/ops/1"),
        (op("delete", "missing", if_match="*"), 412, "/ops/1"),
        (op("patch", "missing", patch={"a": 1}), 404, "/ops/1"),
        (op("delete", "missing"), 404, "/ops/1"),
        (op("put", "x", content={}, namespace="no.such"), 404, "/ops/1"),
        (op("put", "x", content={}, namespace="acme.reads"), 403, "/ops/1"),
        (op("put", "x", content=[1]), 422, "/ops/1/content"),
        (op("put", "bad slug", content={}), 422, "/ops/1/slug"),
    ],
    ids=[
        "stale-if-match",
        "if-none-match-sees-earlier-op",
        "put-if-match-star-missing",
        "patch-if-match-missing",
        "delete-if-match-missing",
        "delete-if-match-star-missing",
        "patch-missing",
        "delete-missing",
        "missing-namespace",
        "read-only-namespace",
        "content-not-object",
        "bad-slug",
    ],
)
def test_batch_failure_rolls_back_every_op(client_for, mixed_author, failing, status, pointer):
    client = client_for(mixed_author)
    before = Changeset.objects.count()
    response = batch(
        client,
        op("put", "first", content={"v": 1}),
        failing,
        op("delete", "there"),
    )
    assert_problem(response, status, pointer=pointer)
    assert Changeset.objects.count() == before
    assert_problem(client.get(url("first")), 404)
    assert client.get(url("there")).json()["version"] == 1


def test_batch_patch_of_entity_deleted_earlier_in_the_batch_is_404(api, existing):
    response = batch(api, op("delete", "order.placed"), op("patch", "order.placed", patch={"a": 1}))
    assert_problem(response, 404, pointer="/ops/1")
    assert api.get(ENTITY).status_code == 200


def test_batch_dry_run_reports_the_same_results_and_writes_nothing(api, existing):
    ops = [
        op("put", "order.placed", content={"title": "renamed"}, if_match=1),
        op("put", "new", content={"a": 1}),
        op("patch", "new", patch={"b": 2}),
        op("delete", "order.placed"),
    ]
    before = (Changeset.objects.count(), Revision.objects.count())
    dry = batch(api, *ops, dry_run=True)
    assert dry.status_code == 200, dry.content
    assert dry.json()["changeset"] is None
    assert dry.json()["dry_run"] is True
    assert (Changeset.objects.count(), Revision.objects.count()) == before
    assert api.get(ENTITY).json()["content"] == {"title": "Order placed"}
    assert_problem(api.get(url("new")), 404)

    real = batch(api, *ops)
    assert real.status_code == 200
    assert real.json()["results"] == dry.json()["results"]
    assert real.json()["dry_run"] is False
    assert real.json()["changeset"]["op_count"] == 2


def test_batch_dry_run_still_reports_failures(api, existing):
    response = batch(api, op("delete", "order.placed", if_match=5), dry_run=True)
    assert_problem(response, 412, pointer="/ops/0")


@override_settings(ATLAS_MAX_BATCH_OPS=5)
def test_batch_over_the_op_limit_is_413(api, namespace):
    ops = [op("put", f"s{i}", content={"i": i}) for i in range(6)]
    assert_problem(batch(api, *ops), 413, pointer="/ops")
    assert not Changeset.objects.exists()
    response = batch(api, *ops[:5])
    assert response.status_code == 200
    assert len(response.json()["results"]) == 5


def test_batch_costs_a_bounded_number_of_queries(api, namespace, django_assert_max_num_queries):
    ops = [op("put", f"s{i}", content={"i": i}) for i in range(200)]
    batch(api, op("put", "warm", content={}))  # token and role lookups are cached per user
    with django_assert_max_num_queries(25):
        response = batch(api, *ops)
    assert response.status_code == 200
    assert response.json()["changeset"]["op_count"] == 200


# --- delete-by-query --------------------------------------------------------------------------


@pytest.fixture
def orders(write, writer, make_user):
    """Order events, an order command and a billing event; ``writer`` writes acme.orders only."""
    staff_like = make_user("ops", maintainer=["acme.orders", "acme.billing"])
    for path in [
        "acme.orders/event/order.placed",
        "acme.orders/event/order.paid",
        "acme.orders/event/orderly",
        "acme.orders/event/refund.issued",
        "acme.orders/command/order.cancel",
        "acme.billing/event/order.placed",
    ]:
        write(staff_like, path, {"path": path})


def test_delete_by_query_deletes_every_match_as_one_changeset(api, orders):
    before = Changeset.objects.count()
    body = {
        "namespace": "acme.orders",
        "kind": "event",
        "slug_prefix": "order.",
        "comment": "purge",
    }
    response = api.post(DELETE_BY_QUERY, body, format="json")
    assert response.status_code == 200, response.content
    result = response.json()
    assert result["deleted"] == 2
    assert result["dry_run"] is False
    changeset = result["changeset"]
    assert changeset["rpc"] == "DeleteByQuery"
    assert changeset["comment"] == "purge"
    assert changeset["op_count"] == 2
    assert sorted((o["slug"], o["op"]) for o in changeset["ops"]) == [
        ("order.paid", "delete"),
        ("order.placed", "delete"),
    ]
    assert Changeset.objects.count() == before + 1
    remaining = keys(api.get(ENTITIES, {"namespace": "acme.orders"}).json()["results"])
    assert remaining == [
        ("acme.orders", "command", "order.cancel"),
        ("acme.orders", "event", "orderly"),
        ("acme.orders", "event", "refund.issued"),
    ]


def test_delete_by_query_without_filters_empties_the_namespace_only(api, client_for, staff, orders):
    response = api.post(DELETE_BY_QUERY, {"namespace": "acme.orders"}, format="json")
    assert response.json()["deleted"] == 5
    assert keys(client_for(staff).get(ENTITIES).json()["results"]) == [
        ("acme.billing", "event", "order.placed")
    ]


def test_delete_by_query_dry_run_counts_and_writes_nothing(api, orders):
    before = (Changeset.objects.count(), Revision.objects.count())
    body = {"namespace": "acme.orders", "kind": "event", "dry_run": True}
    response = api.post(DELETE_BY_QUERY, body, format="json")
    assert response.status_code == 200
    assert response.json() == {"changeset": None, "deleted": 4, "dry_run": True}
    assert (Changeset.objects.count(), Revision.objects.count()) == before
    assert len(api.get(ENTITIES, {"kind": "event"}).json()["results"]) == 4


def test_delete_by_query_matching_nothing_writes_nothing(api, orders):
    before = Changeset.objects.count()
    body = {"namespace": "acme.orders", "slug_prefix": "order_"}
    response = api.post(DELETE_BY_QUERY, body, format="json")
    assert response.json() == {"changeset": None, "deleted": 0, "dry_run": False}
    assert Changeset.objects.count() == before


def test_delete_by_query_by_a_reader_is_403(client_for, make_user, orders):
    reader = client_for(make_user("rita", reader=["acme.orders"]))
    response = reader.post(DELETE_BY_QUERY, {"namespace": "acme.orders"}, format="json")
    assert_problem(response, 403)
    assert len(reader.get(ENTITIES).json()["results"]) == 5


def test_delete_by_query_in_unknown_or_unreadable_namespace_is_404(api, orders):
    for name in ("no.such", "acme.billing"):
        response = api.post(DELETE_BY_QUERY, {"namespace": name}, format="json")
        assert_problem(response, 404, pointer="/namespace")


@pytest.mark.parametrize(
    ("body", "pointers"),
    [
        ({}, ["/namespace"]),
        ({"namespace": "Acme"}, ["/namespace"]),
        ({"namespace": "acme.orders", "kind": "Event"}, ["/kind"]),
        ({"namespace": "acme.orders", "slug_prefix": 5}, ["/slug_prefix"]),
        ({"namespace": "acme.orders", "dry_run": "no"}, ["/dry_run"]),
        ({"namespace": "acme.orders", "where": "all"}, ["/where"]),
    ],
)
def test_delete_by_query_with_invalid_body_is_422(api, namespace, body, pointers):
    response = api.post(DELETE_BY_QUERY, body, format="json")
    assert_problem(response, 422, error_pointers=pointers)
