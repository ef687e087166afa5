"""Key-filtered history and ``GET /revisions`` (API.md "Key-level history").

The key rule: a revision matches ``key`` when some changed pointer P equals
it, lies inside it (P starts with key + "/") or contains it (key starts with
P + "/"). ``changesets.pointers.relates`` says it in Python; the index terms
(``atlas_key_terms``/``atlas_key_query``, migration 0013) are pinned to it
on random pointers.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
from django.db import connection

from changesets import pointers
from changesets.models import Revision, Rpc
from changesets.ops import DeleteOp, PutOp
from changesets.selectors import entity_keys
from changesets.services.apply import changeset_apply
from entities.store import baseline
from tests.atlas.test_errors import assert_problem
from tests.changesets.helpers import key
from tests.changesets.partition_helpers import parent_index

API = "/api/v1"
NS = "acme.orders"
URL = f"{API}/entities/{NS}/order/o-1"


@pytest.fixture
def api(staff, client_for):
    return client_for(staff)


def put(actor: Any, path: str, content: dict, *, store: Any = baseline) -> Any:
    return changeset_apply(
        store=store, actor=actor, ops=[PutOp(key(path), content)], rpc=Rpc.PUT_ENTITY
    )


@pytest.fixture
def story(staff, namespace):
    """o-1's four changesets: create, then one change each under /a/b, /a/c and /d."""
    path = f"{NS}/order/o-1"
    seqs = [
        put(staff, path, {"a": {"b": {"x": 1}, "c": 1}, "d": 1}).changeset.seq,  # /a, /d
        put(staff, path, {"a": {"b": {"x": 2}, "c": 1}, "d": 1}).changeset.seq,  # /a/b/x
        put(staff, path, {"a": {"b": {"x": 2}, "c": 2}, "d": 1}).changeset.seq,  # /a/c
        put(staff, path, {"a": {"b": {"x": 2}, "c": 2}, "d": 2}).changeset.seq,  # /d
    ]
    return seqs


def history_seqs(api: Any, pointer: str, url: str = URL, **params: Any) -> list[int]:
    response = api.get(f"{url}/history", {"key": pointer, **params})
    assert response.status_code == 200, response.content
    return [r["seq"] for r in response.json()["results"]]


@pytest.mark.parametrize(
    ("pointer", "picks"),
    [
        pytest.param("/d", [3, 0], id="equal"),
        pytest.param("/a/b", [1, 0], id="changed-inside-the-key-or-containing-it"),
        pytest.param("/a", [2, 1, 0], id="inside"),
        pytest.param("/a/b/x/deeper", [1, 0], id="contained-by-a-changed-pointer"),
        pytest.param("/a/c", [2, 0], id="contained-by-the-create"),
        pytest.param("/e", [], id="unrelated"),
        pytest.param("/a/bb", [0], id="a-sibling-with-a-common-prefix-is-unrelated"),
        pytest.param("", [3, 2, 1, 0], id="the-whole-document"),
    ],
)
def test_history_by_key(api, story, pointer, picks):
    assert history_seqs(api, pointer) == [story[i] for i in picks]


def test_history_by_key_pages(api, story):
    first = api.get(f"{URL}/history", {"key": "/a", "page_size": 2}).json()
    assert [r["seq"] for r in first["results"]] == [story[2], story[1]]
    rest = api.get(
        f"{URL}/history", {"key": "/a", "page_size": 2, "page_token": first["next_page_token"]}
    ).json()
    assert [r["seq"] for r in rest["results"]] == [story[0]]
    assert rest["next_page_token"] is None
    # A token belongs to its key.
    other = api.get(f"{URL}/history", {"key": "/d", "page_token": first["next_page_token"]})
    assert_problem(other, 400, pointer="/page_token")


def test_history_by_key_below_the_walk_keeps_the_rule_across_lives(
    api, staff, namespace, monkeypatch
):
    """Below the walk (a window of 7 here), history by key reads an update off the
    update terms' posting lists and a create or a delete off the entity's own rows
    (``entity_keys._probe``, migration 0039). Every key and page, across a delete
    and a re-create, against the rule applied to every revision of the entity."""
    monkeypatch.setattr(entity_keys, "ENTITY_KEY_WINDOW", 7)
    changeset_apply(  # other entities' creates of /a, in the same posting lists
        store=baseline,
        actor=staff,
        ops=[PutOp(key(f"{NS}/item/other-{i}"), {"a": i, "n": 0}) for i in range(30)],
        rpc=Rpc.BATCH_MUTATE,
    )
    path = f"{NS}/item/busy"
    put(staff, path, {"a": {"b": 0}, "n": 0})
    put(staff, path, {"a": {"b": 1}, "n": 0})
    changeset_apply(store=baseline, actor=staff, ops=[DeleteOp(key(path))], rpc=Rpc.DELETE_ENTITY)
    put(staff, path, {"a": {"b": 1}, "n": 0})
    for i in range(1, 20):
        put(staff, path, {"a": {"b": 1}, "n": i})
    put(staff, path, {"a": {"b": 2, "c": 1}, "n": 20})
    revisions = Revision.objects.filter(namespace=NS, kind="item", slug="busy").order_by("-seq")
    for pointer in ["/a", "/a/b", "/a/c", "/n", "/z", ""]:
        expected = [
            r.seq
            for r in revisions
            if (any(pointers.relates(p, pointer) for p in r.changed) if pointer else r.changed)
        ]
        got, token = [], None
        while True:
            params = {"key": pointer, "page_size": 3, **({"page_token": token} if token else {})}
            body = api.get(f"{API}/entities/{path}/history", params).json()
            got += [r["seq"] for r in body["results"]]
            if not (token := body["next_page_token"]):
                break
        assert got == expected, pointer
    assert len(history_seqs(api, "/a", url=f"{API}/entities/{path}")) == 5


@pytest.mark.parametrize("bad", ["a", "/a~", "/a~2b", "/x" * 1001])
def test_a_key_that_is_not_a_json_pointer_is_422(api, story, bad):
    assert_problem(api.get(f"{URL}/history", {"key": bad}), 422, pointer="/key")
    response = api.get(f"{API}/revisions", {"namespace": NS, "key": bad})
    assert_problem(response, 422, pointer="/key")


def test_history_by_key_of_an_unknown_or_hidden_entity_is_404(api, story, client_for, make_user):
    assert_problem(api.get(f"{API}/entities/{NS}/order/nope/history", {"key": "/a"}), 404)
    stranger = client_for(make_user("stranger", reader=["acme.other"]))
    assert_problem(stranger.get(f"{URL}/history", {"key": "/a"}), 404)


# --- GET /revisions ------------------------------------------------------------------------


def revisions(client: Any, **params: Any) -> list[dict[str, Any]]:
    response = client.get(f"{API}/revisions", params)
    assert response.status_code == 200, response.content
    return response.json()["results"]


@pytest.fixture
def spread(staff, make_user, namespace):
    """Writes by two authors across two kinds of acme.orders, and one elsewhere."""
    alice = make_user("alice", writer=[NS, "acme.billing"])
    put(staff, f"{NS}/order/o-1", {"status": "new", "total": 1})
    put(alice, f"{NS}/order/o-2", {"status": "new"})
    put(alice, f"{NS}/event/e-1", {"status": {"code": 1}})
    put(staff, f"{NS}/order/o-1", {"status": "paid", "total": 1})
    put(alice, f"{NS}/event/e-1", {"status": {"code": 2}, "note": "x"})
    put(alice, "acme.billing/invoice/i-1", {"status": "new"})
    return alice


def test_revisions_across_a_namespace_newest_first_with_the_key_rule(api, spread):
    rows = revisions(api, namespace=NS, key="/status")
    assert [(r["slug"], r["changed"]) for r in rows] == [
        ("e-1", ["/note", "/status/code"]),
        ("o-1", ["/status"]),
        ("e-1", ["/status"]),
        ("o-2", ["/status"]),
        ("o-1", ["/status", "/total"]),
    ]
    assert [r["seq"] for r in rows] == sorted((r["seq"] for r in rows), reverse=True)
    assert {r["namespace"] for r in rows} == {NS}
    assert [r["slug"] for r in revisions(api, namespace=NS, key="/status/code")] == [
        "e-1",
        "o-1",
        "e-1",
        "o-2",
        "o-1",
    ]
    assert [r["slug"] for r in revisions(api, namespace=NS, key="/total")] == ["o-1"]
    assert len(revisions(api, namespace=NS)) == 5


def test_revisions_filters(api, spread):
    assert {r["slug"] for r in revisions(api, namespace=NS, kind="event")} == {"e-1"}
    assert {r["author"] for r in revisions(api, namespace=NS, author="alice")} == {"alice"}
    assert len(revisions(api, namespace=NS, author="alice")) == 3
    rows = revisions(api, namespace=NS)
    middle = rows[2]["at"]
    since = revisions(api, namespace=NS, since=middle)
    until = revisions(api, namespace=NS, until=middle)
    assert {r["seq"] for r in since} | {r["seq"] for r in until} == {r["seq"] for r in rows}
    assert all(r["at"] >= middle for r in since) and all(r["at"] <= middle for r in until)


@pytest.mark.parametrize("by_key", [True, False])
def test_revisions_page_without_gaps_or_duplicates(api, staff, namespace, by_key):
    # One batch writes three keys: rows of one changeset share a seq. Without a key
    # a page is read by the namespace's changesets (``keys._by_changesets``): the
    # single writes' pages end on a changeset whose rows are all shown, and the next
    # page starts below it.
    changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(key(f"{NS}/order/b-{i}"), {"k": i}) for i in range(3)],
        rpc=Rpc.BATCH_MUTATE,
    )
    for i in range(4):
        put(staff, f"{NS}/order/s-{i}", {"k": i})
    seen: list[int] = []
    params: dict[str, Any] = {"namespace": NS, "page_size": 2}
    if by_key:
        params["key"] = "/k"
    while True:
        body = api.get(f"{API}/revisions", params).json()
        seen += [r for r in (row["seq"] * 1000 + int(row["slug"][2:]) for row in body["results"])]
        if body["next_page_token"] is None:
            break
        params["page_token"] = body["next_page_token"]
    assert len(seen) == len(set(seen)) == 7
    expected = Revision.objects.filter(namespace=NS).order_by("-seq", "-id")
    assert seen == [r.seq * 1000 + int(r.slug[2:]) for r in expected]


def test_revisions_needs_a_namespace_and_checks_its_inputs(api, db):
    assert_problem(api.get(f"{API}/revisions"), 422, pointer="/namespace")
    assert_problem(api.get(f"{API}/revisions", {"key": "/a"}), 422, pointer="/namespace")
    assert_problem(api.get(f"{API}/revisions", {"namespace": "Bad NS"}), 422, pointer="/namespace")
    response = api.get(f"{API}/revisions", {"namespace": NS, "since": "yesterday"})
    assert_problem(response, 422, pointer="/since")
    assert_problem(api.get(f"{API}/revisions", {"namespace": NS, "nope": 1}), 422)


def test_revisions_show_only_what_the_caller_may_read(spread, client_for, make_user):
    billing = client_for(make_user("bob", reader=["acme.billing"]))
    assert revisions(billing, namespace=NS) == []
    assert revisions(billing, namespace=NS, key="/status") == []
    assert [r["slug"] for r in revisions(billing, namespace="acme.billing")] == ["i-1"]
    response = billing.get(f"{API}/revisions", {"namespace": NS}, HTTP_X_ATLAS_BRANCH="nope")
    assert_problem(response, 404)


def test_revisions_follow_the_branch_header(api, staff, namespace):
    put(staff, f"{NS}/order/o-1", {"status": "new"})
    created = api.post(f"{API}/branches", {"name": "feature"}, format="json")
    assert created.status_code == 201, created.content
    response = api.put(
        f"{API}/entities/{NS}/order/o-1",
        {"content": {"status": "draft"}},
        format="json",
        HTTP_X_ATLAS_BRANCH="feature",
    )
    assert response.status_code == 200, response.content
    on_branch = api.get(
        f"{API}/revisions", {"namespace": NS, "key": "/status"}, HTTP_X_ATLAS_BRANCH="feature"
    ).json()["results"]
    assert [(r["branch"], r["after"]) for r in on_branch] == [("feature", {"status": "draft"})]
    on_baseline = revisions(api, namespace=NS, key="/status")
    assert [(r["branch"], r["after"]) for r in on_baseline] == [("", {"status": "new"})]
    history = api.get(
        f"{API}/entities/{NS}/order/o-1/history", {"key": "/status"}, HTTP_X_ATLAS_BRANCH="feature"
    ).json()["results"]
    assert [r["branch"] for r in history] == ["feature"]


# --- the index terms are the rule -----------------------------------------------------------

SEGMENTS = ["a", "b", "ab", "a~0", "a~1b", "é", ""]


def random_pointer(rng: random.Random) -> str:
    return "".join("/" + rng.choice(SEGMENTS) for _ in range(rng.randint(1, 4)))


def test_index_terms_match_the_key_rule_on_random_pointers(db):
    rng = random.Random(16)
    cases = []
    for _ in range(400):
        changed = sorted({random_pointer(rng) for _ in range(rng.randint(1, 4))})
        probe = rng.choice([*changed, random_pointer(rng), changed[0].rsplit("/", 1)[0] or "/a"])
        cases.append((changed, probe))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT atlas_key_terms('', 'ns', array_to_string(ARRAY("
            "SELECT jsonb_array_elements_text(c.v->0)), '~2'), op)"
            " && atlas_key_query('', 'ns', c.v->>1),"
            " atlas_key_terms('', 'ns', array_to_string(ARRAY("
            "SELECT jsonb_array_elements_text(c.v->0)), '~2'), op)"
            " && atlas_update_key_query('', 'ns', c.v->>1)"
            " FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS c(v, n),"
            " unnest(ARRAY['update', 'create', 'delete']) AS op ORDER BY n, op",
            [json.dumps(cases)],
        )
        answers = cursor.fetchall()
    # Per case: create, delete, update (the order of the op names).
    for i, (changed, probe) in enumerate(cases):
        expected = any(pointers.relates(p, probe) for p in changed)
        whole_images, update = answers[3 * i : 3 * i + 2], answers[3 * i + 2]
        # The key rule holds for every op; the update query (migration 0039) finds
        # an update's terms and never a create's or a delete's.
        assert update == (expected, expected), (changed, probe)
        assert whole_images == [(expected, False)] * 2, (changed, probe)


def test_the_key_query_can_use_the_gin_index(api, spread):
    with connection.cursor() as cursor:
        # Tiny tables read whole beat any index: take those plans away, so the
        # question is only whether the condition matches the index expression.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute(
            "EXPLAIN SELECT id FROM changesets_revision"
            " WHERE atlas_key_terms(branch, namespace, changed, op)"
            " && atlas_key_query('', %s, '/a')",
            [NS],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # The partitions' indexes of revision_changed_keys (the table is partitioned by seq).
    used = set(re.findall(r"Index Scan on (\S+)", plan))
    assert used and {parent_index(name) for name in used} == {"revision_changed_keys"}, plan
