"""The changeset log API: list (order, filters, paging), one changeset, its revisions."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, timedelta, timezone
from typing import Any

import pytest

from atlas.api import paging
from changesets.models import Changeset, Rpc
from changesets.ops import PutOp
from changesets.services.apply import changeset_apply
from entities.store import NO_WRITES, EntityKey, Locked, namespaces_of
from tests.entities.factories import NamespaceFactory

API = "/api/v1"
RFC3339_MS_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
CHANGESET_FIELDS = {
    "id",
    "seq",
    "author",
    "at",
    "message",
    "comment",
    "metadata",
    "context",
    "branch",
    "rpc",
    "op_count",
    "op_count_visible",
    "ops",
}
OP_FIELDS = {"namespace", "kind", "slug", "op", "before_version", "after_version", "changed"}
REVISION_FIELDS = {
    "changeset_id",
    "seq",
    "author",
    "at",
    "rpc",
    "branch",
    "namespace",
    "kind",
    "slug",
    "op",
    "before_version",
    "after_version",
    "before",
    "after",
    "changed",
}


@pytest.fixture
def api(staff, client_for):
    return client_for(staff)


def ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [c["id"] for c in response.json()["results"]]


def _stamp(changeset_id: str, tz: timezone = UTC) -> str:
    """The changeset's exact ``at`` (microseconds) as RFC 3339."""
    at = Changeset.objects.get(pk=changeset_id).at.astimezone(tz)
    return at.isoformat().replace("+00:00", "Z")


def _assert_problem(response, status: int, pointer: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    if pointer is not None:
        assert pointer in [body.get("pointer")] + [e["pointer"] for e in body.get("errors", [])]
    return body


class _BranchStore:
    """A stand-in overlay store (branches are not built yet) so the write
    service records changesets on a named branch."""

    branch = "feature"

    def get(self, key):
        return None

    def list(self, **kwargs):
        return []

    def lock(self, keys, **kwargs):
        return Locked({}, namespaces_of(k.namespace for k in keys))

    def write_sql(self, **kwargs):
        return NO_WRITES


def _write_on_branch(actor, path: str, content: dict) -> str:
    result = changeset_apply(
        store=_BranchStore(),
        actor=actor,
        ops=[PutOp(EntityKey(*path.split("/")), content)],
        rpc=Rpc.PUT_ENTITY,
    )
    return str(result.changeset.id)


def _cs(result) -> str:
    return str(result.changeset.id)


# --- list: order and filters ------------------------------------------------------


def test_list_is_newest_first(api, staff, namespace, write):
    written = [_cs(write(staff, f"acme.orders/event/e{i}", {"i": i})) for i in range(4)]
    body = api.get(f"{API}/changesets").json()
    assert [c["id"] for c in body["results"]] == written[::-1]
    seqs = [c["seq"] for c in body["results"]]
    assert seqs == sorted(seqs, reverse=True)
    assert body["next_page_token"] is None


def test_branch_filter(api, staff, namespace, write):
    b1 = _cs(write(staff, "acme.orders/event/e1", {"v": 1}))
    f1 = _write_on_branch(staff, "acme.orders/event/e1", {"v": "branch"})
    b2 = _cs(write(staff, "acme.orders/event/e2", {"v": 1}))

    assert ids(api.get(f"{API}/changesets")) == [b2, f1, b1]  # absent: all
    assert ids(api.get(f"{API}/changesets?branch=")) == [b2, b1]  # empty: baseline
    assert ids(api.get(f"{API}/changesets", {"branch": "feature"})) == [f1]
    assert ids(api.get(f"{API}/changesets", {"branch": "nope"})) == []
    feature = api.get(f"{API}/changesets/{f1}").json()
    assert feature["branch"] == "feature"


def test_namespace_filter(api, staff, write):
    NamespaceFactory(name="acme.orders")
    NamespaceFactory(name="acme.billing")
    a = _cs(write(staff, "acme.orders/event/e1", {}))
    b = _cs(write(staff, "acme.billing/event/e1", {}))
    assert ids(api.get(f"{API}/changesets", {"namespace": "acme.orders"})) == [a]
    assert ids(api.get(f"{API}/changesets", {"namespace": "acme.billing"})) == [b]
    assert ids(api.get(f"{API}/changesets", {"namespace": "acme.none"})) == []
    _assert_problem(api.get(f"{API}/changesets", {"namespace": "Not Valid"}), 422, "/namespace")


def test_author_filter(api, make_user, namespace, write):
    alice = make_user("alice", writer=[namespace.name])
    bob = make_user("bob", writer=[namespace.name])
    a1 = _cs(write(alice, "acme.orders/event/e1", {}))
    b1 = _cs(write(bob, "acme.orders/event/e2", {}))
    a2 = _cs(write(alice, "acme.orders/event/e3", {}))
    assert ids(api.get(f"{API}/changesets", {"author": "alice"})) == [a2, a1]
    assert ids(api.get(f"{API}/changesets", {"author": "bob"})) == [b1]
    assert ids(api.get(f"{API}/changesets", {"author": "mallory"})) == []


def test_rpc_filter(api, staff, namespace, write):
    put = _cs(write(staff, "acme.orders/event/e1", {"v": 1}))
    patch = _cs(write(staff, "acme.orders/event/e1", {"w": 2}, patch=True))
    response = api.post(
        f"{API}/batch",
        {
            "ops": [
                {"op": "put", "namespace": "acme.orders", "kind": "k", "slug": "s", "content": {}}
            ]
        },
        format="json",
    )
    batch = response.json()["changeset"]["id"]
    delete = _cs(write(staff, "acme.orders/event/e1", None))
    assert ids(api.get(f"{API}/changesets", {"rpc": "PutEntity"})) == [put]
    assert ids(api.get(f"{API}/changesets", {"rpc": "PatchEntity"})) == [patch]
    assert ids(api.get(f"{API}/changesets", {"rpc": "BatchMutate"})) == [batch]
    assert ids(api.get(f"{API}/changesets", {"rpc": "DeleteEntity"})) == [delete]
    assert ids(api.get(f"{API}/changesets", {"rpc": "MergeBranch"})) == []


@pytest.mark.parametrize("rpc", ["Bogus", "putentity", "PUT_ENTITY"])
def test_invalid_rpc_is_422(api, db, rpc):
    _assert_problem(api.get(f"{API}/changesets", {"rpc": rpc}), 422, "/rpc")


def test_filters_combine(api, make_user, namespace, write):
    alice = make_user("alice", writer=[namespace.name])
    a1 = _cs(write(alice, "acme.orders/event/e1", {"v": 1}))
    write(alice, "acme.orders/event/e1", {"v": 2}, patch=True)
    write(make_user("bob", writer=[namespace.name]), "acme.orders/event/e2", {})
    response = api.get(f"{API}/changesets", {"author": "alice", "rpc": "PutEntity", "branch": ""})
    assert ids(response) == [a1]


def test_since_and_until(api, staff, namespace, write):
    c1, c2, c3 = (_cs(write(staff, f"acme.orders/event/e{i}", {})) for i in range(3))
    assert ids(api.get(f"{API}/changesets", {"since": _stamp(c2)})) == [c3, c2]
    assert ids(api.get(f"{API}/changesets", {"until": _stamp(c2)})) == [c2, c1]
    both = {"since": _stamp(c2), "until": _stamp(c2)}
    assert ids(api.get(f"{API}/changesets", both)) == [c2]
    # an offset other than Z names the same instant
    plus_two = timezone(timedelta(hours=2))
    assert ids(api.get(f"{API}/changesets", {"since": _stamp(c2, plus_two)})) == [c3, c2]
    later = (Changeset.objects.get(pk=c3).at + timedelta(hours=1)).isoformat()
    assert ids(api.get(f"{API}/changesets", {"since": later})) == []


@pytest.mark.parametrize("name", ["since", "until"])
@pytest.mark.parametrize(
    "value",
    [
        "yesterday",
        "2024-01-01T00:00:00",  # no offset
        "2024-01-01",
        "1700000000",
        "2024-13-01T00:00:00Z",  # well-formed but impossible: was a 500
        "2024-02-30T00:00:00Z",
        "2024-01-01T24:00:00Z",
        "20240101T000000Z",  # ISO 8601 basic format, not RFC 3339
        "2024-W01-1T00:00:00Z",
        "2024-01-01T00:00Z",  # no seconds
        "2024-01-01T00:00:00Z\n",
    ],
)
def test_invalid_timestamp_is_422(api, db, name, value):
    body = _assert_problem(api.get(f"{API}/changesets", {name: value}), 422, f"/{name}")
    assert body["errors"]


@pytest.mark.parametrize(
    "value", ["2000-01-01T00:00:00Z", "2000-01-01t00:00:00z", "2000-01-01 00:00:00.5+02:00"]
)
def test_rfc3339_variants_are_accepted(api, staff, namespace, write, value):
    cs = _cs(write(staff, "acme.orders/event/e1", {}))
    assert ids(api.get(f"{API}/changesets", {"since": value})) == [cs]
    assert ids(api.get(f"{API}/changesets", {"until": value})) == []


def test_unknown_query_parameter_is_422(api, db):
    _assert_problem(api.get(f"{API}/changesets", {"nmespace": "acme.orders"}), 422, "/nmespace")


# --- paging -------------------------------------------------------------------------


def _walk(api, params: dict[str, Any], between_pages=None) -> tuple[list[str], list[int]]:
    seen: list[str] = []
    sizes: list[int] = []
    params = dict(params)
    while True:
        response = api.get(f"{API}/changesets", params)
        assert response.status_code == 200, response.content
        body = response.json()
        seen += [c["id"] for c in body["results"]]
        sizes.append(len(body["results"]))
        if body["next_page_token"] is None:
            return seen, sizes
        params["page_token"] = body["next_page_token"]
        if between_pages:
            between_pages()


def test_paging_walks_everything_once(api, staff, namespace, write):
    written = [_cs(write(staff, f"acme.orders/event/e{i}", {})) for i in range(5)]
    seen, sizes = _walk(api, {"page_size": 2})
    assert seen == written[::-1]
    assert sizes == [2, 2, 1]


def test_paging_has_no_dupes_when_changesets_land_between_pages(api, staff, namespace, write):
    written = [_cs(write(staff, f"acme.orders/event/e{i}", {})) for i in range(5)]
    counter = iter(range(100))

    def land() -> None:
        write(staff, f"acme.orders/event/new{next(counter)}", {})

    seen, _ = _walk(api, {"page_size": 2}, between_pages=land)
    assert seen == written[::-1]
    assert len(set(seen)) == len(seen)
    assert Changeset.objects.count() == 5 + 2  # two pages were followed by a write


def test_paging_with_filters(api, make_user, namespace, write):
    alice = make_user("alice", writer=[namespace.name])
    bob = make_user("bob", writer=[namespace.name])
    mine = []
    for i in range(5):
        mine.append(_cs(write(alice, f"acme.orders/event/a{i}", {})))
        write(bob, f"acme.orders/event/b{i}", {})
    seen, sizes = _walk(api, {"page_size": 2, "author": "alice"})
    assert seen == mine[::-1]
    assert sizes == [2, 2, 1]


def _first_token(api, params: dict[str, Any]) -> str:
    body = api.get(f"{API}/changesets", {**params, "page_size": 1}).json()
    assert body["next_page_token"]
    return body["next_page_token"]


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({}, {"author": "root"}),
        ({}, {"branch": ""}),
        ({"branch": ""}, {}),
        ({"rpc": "PutEntity"}, {"rpc": "PatchEntity"}),
        ({"namespace": "acme.orders"}, {}),
    ],
    ids=["add-author", "absent-to-empty-branch", "empty-to-absent-branch", "rpc", "drop-ns"],
)
def test_token_reused_with_other_filters_is_400(api, staff, namespace, write, first, then):
    for i in range(3):
        write(staff, f"acme.orders/event/e{i}", {})
    token = _first_token(api, first)
    response = api.get(f"{API}/changesets", {**then, "page_size": 1, "page_token": token})
    _assert_problem(response, 400)


def test_token_is_tamper_evident(api, staff, namespace, write):
    for i in range(3):
        write(staff, f"acme.orders/event/e{i}", {})
    token = _first_token(api, {})
    flipped = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    for bad in (flipped, token[:-1], "x" + token, "garbage", "eyJzIjogMX0"):
        response = api.get(f"{API}/changesets", {"page_size": 1, "page_token": bad})
        _assert_problem(response, 400, "/page_token")


def test_token_of_another_user_or_listing_is_400(api, staff, make_user, client_for, write):
    NamespaceFactory(name="acme.orders")
    for i in range(3):
        write(staff, f"acme.orders/event/e{i}", {})
    token = _first_token(api, {})
    other = client_for(make_user("alice", reader=["acme.orders"]))
    _assert_problem(other.get(f"{API}/changesets", {"page_size": 1, "page_token": token}), 400)
    entity_token = api.get(f"{API}/entities", {"page_size": 1}).json()["next_page_token"]
    assert entity_token
    response = api.get(f"{API}/changesets", {"page_size": 1, "page_token": entity_token})
    _assert_problem(response, 400)


def test_page_size_above_max_is_clamped(api, staff, namespace, write, monkeypatch):
    written = [_cs(write(staff, f"acme.orders/event/e{i}", {})) for i in range(3)]
    body = api.get(f"{API}/changesets", {"page_size": 1000}).json()
    assert [c["id"] for c in body["results"]] == written[::-1]
    assert body["next_page_token"] is None
    # The clamp itself, without writing 501 changesets: lower the maximum.
    monkeypatch.setattr(paging, "MAX_PAGE_SIZE", 2)
    body = api.get(f"{API}/changesets", {"page_size": 1000}).json()
    assert len(body["results"]) == 2
    assert body["next_page_token"]


@pytest.mark.parametrize("size", ["0", "-1", "abc", "1.5"])
def test_bad_page_size_is_422(api, db, size):
    _assert_problem(api.get(f"{API}/changesets", {"page_size": size}), 422, "/page_size")


def test_default_page_size_is_50(api, staff, namespace, write):
    for i in range(51):
        write(staff, "acme.orders/event/e", {"i": i})
    body = api.get(f"{API}/changesets").json()
    assert len(body["results"]) == paging.DEFAULT_PAGE_SIZE == 50
    assert body["next_page_token"]


# --- one changeset ------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad_id",
    [
        "not-a-uuid",
        "123",
        "01900000-0000-7000-8000-00000000000",
        "5d0a8b4e-3f1c-4b7a-9e26-8c1d2f0a7b13",
        "%20",
    ],
)
@pytest.mark.parametrize("suffix", ["", "/revisions"])
def test_unknown_or_malformed_id_is_404(api, staff, namespace, write, bad_id, suffix):
    write(staff, "acme.orders/event/e1", {})
    _assert_problem(api.get(f"{API}/changesets/{bad_id}{suffix}"), 404)


def test_changeset_representation(api, writer, client_for, namespace):
    client = client_for(writer)
    response = client.put(
        f"{API}/entities/acme.orders/event/order.placed",
        {"content": {"title": "Order placed"}, "comment": "first cut"},
        format="json",
    )
    assert response.status_code == 201
    written = response.json()["changeset"]

    body = client.get(f"{API}/changesets/{written['id']}").json()
    # One changeset pages its ops (ops_next_page_token); a list entry says
    # whether it cut them (ops_truncated); a write response embeds them all.
    assert set(body) == CHANGESET_FIELDS | {"ops_next_page_token"}
    assert set(written) == CHANGESET_FIELDS
    assert body.pop("ops_next_page_token") is None
    assert body == written  # the write response and the log agree
    assert uuid.UUID(body["id"]).version == 7
    assert isinstance(body["seq"], int) and body["seq"] >= 1
    assert body["author"] == "wendy"
    assert RFC3339_MS_Z.match(body["at"]), body["at"]
    assert body["message"] == "PutEntity: 1 change(s)"
    assert body["comment"] == "first cut"
    assert body["branch"] == ""
    assert body["rpc"] == "PutEntity"
    assert body["op_count"] == body["op_count_visible"] == 1
    assert body["ops"] == [
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
    listed = client.get(f"{API}/changesets").json()["results"]
    assert listed == [{**body, "ops_truncated": False}]


def test_changeset_at_is_utc_milliseconds_of_the_stored_time(api, staff, namespace, write):
    cs = _cs(write(staff, "acme.orders/event/e1", {}))
    body = api.get(f"{API}/changesets/{cs}").json()
    stored = Changeset.objects.get(pk=cs).at.astimezone(UTC)
    assert (
        body["at"] == stored.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stored.microsecond // 1000:03d}Z"
    )


def test_ops_report_update_and_delete_versions(api, staff, namespace, write):
    write(staff, "acme.orders/event/e1", {"v": 1})
    update = _cs(write(staff, "acme.orders/event/e1", {"v": 2}))
    delete = _cs(write(staff, "acme.orders/event/e1", None))
    up = api.get(f"{API}/changesets/{update}").json()
    assert up["message"] == "PutEntity: 1 change(s)"
    assert [(o["op"], o["before_version"], o["after_version"]) for o in up["ops"]] == [
        ("update", 1, 2)
    ]
    down = api.get(f"{API}/changesets/{delete}").json()
    assert down["message"] == "DeleteEntity: 1 change(s)"
    assert [(o["op"], o["before_version"], o["after_version"]) for o in down["ops"]] == [
        ("delete", 2, None)
    ]


# --- revisions ----------------------------------------------------------------------


def test_revisions_are_json_objects_in_write_order(api, staff, namespace, write):
    write(staff, "acme.orders/event/b", {"b": 1, "nested": {"x": [1, 2]}})
    write(staff, "acme.orders/event/d", {"d": 1})
    ops = [
        {
            "op": "put",
            "namespace": "acme.orders",
            "kind": "event",
            "slug": "c",
            "content": {"c": 1},
        },
        {
            "op": "put",
            "namespace": "acme.orders",
            "kind": "event",
            "slug": "a",
            "content": {"a": 1},
        },
        {
            "op": "patch",
            "namespace": "acme.orders",
            "kind": "event",
            "slug": "b",
            "patch": {"b": 2},
        },
        {"op": "delete", "namespace": "acme.orders", "kind": "event", "slug": "d"},
    ]
    response = api.post(f"{API}/batch", {"ops": ops, "comment": "mixed"}, format="json")
    assert response.status_code == 200, response.content
    changeset = response.json()["changeset"]

    response = api.get(f"{API}/changesets/{changeset['id']}/revisions")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"results", "next_page_token"}
    assert body["next_page_token"] is None
    rows = body["results"]
    assert [(r["slug"], r["op"]) for r in rows] == [
        ("c", "create"),
        ("a", "create"),
        ("b", "update"),
        ("d", "delete"),
    ]
    assert [r["slug"] for r in rows] == [o["slug"] for o in changeset["ops"]]
    for row in rows:
        assert set(row) == REVISION_FIELDS
        assert row["changeset_id"] == changeset["id"]
        assert row["seq"] == changeset["seq"]
        assert row["author"] == "root"
        assert row["at"] == changeset["at"]
        assert row["rpc"] == "BatchMutate"
        assert row["branch"] == ""
    c, a, b, d = rows
    assert (c["before"], c["after"]) == (None, {"c": 1})
    assert (a["before"], a["after"]) == (None, {"a": 1})
    assert b["before"] == {"b": 1, "nested": {"x": [1, 2]}}
    assert b["after"] == {"b": 2, "nested": {"x": [1, 2]}}
    assert isinstance(b["before"], dict) and isinstance(b["after"]["nested"], dict)
    assert (b["before_version"], b["after_version"]) == (1, 2)
    assert (d["before"], d["after"]) == ({"d": 1}, None)
    assert (d["before_version"], d["after_version"]) == (1, None)


def test_revisions_match_entity_history(api, staff, namespace, write):
    cs = _cs(write(staff, "acme.orders/event/e1", {"v": 1}))
    from_changeset = api.get(f"{API}/changesets/{cs}/revisions").json()["results"]
    history = api.get(f"{API}/entities/acme.orders/event/e1/history").json()["results"]
    assert from_changeset == history
