"""Blame and diff (API.md "Key-level history, blame, diff") against a brute-force replay.

A seeded generator writes a history of nested documents (puts, merge patches,
deletes, re-creates, batches) through the write service and keeps the whole
namespace's state after every changeset. Blame is checked against the
definition itself: a leaf was last set by the newest changeset whose before
and after disagree at that leaf (walking objects only: arrays are values).
Diffs must name exactly the entities that differ, and every patch must apply
(``jsonpatch.apply_patch(before, patch) == after``, compared as JSON).
"""

from __future__ import annotations

import copy
import random
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from atlas.api.render import rfc3339
from changesets import pointers
from changesets.models import Changeset, Rpc
from changesets.ops import DeleteOp, PatchOp, PutOp, canonical
from changesets.selectors import blame as blame_selectors
from changesets.selectors import entity_keys
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.atlas.test_errors import assert_problem
from tests.changesets.test_changed_keys import mutate, random_doc
from tests.changesets.test_time_seek import analyze, nodes
from tests.entities.factories import NamespaceFactory

API = "/api/v1"
NS = "acme.orders"
SLUGS = [f"e-{i}" for i in range(5)]
ABSENT: Any = object()


@pytest.fixture
def api(staff, client_for):
    return client_for(staff)


@dataclass
class Step:
    changeset: Changeset
    changes: dict[str, tuple[Any, Any]]  # slug -> (before, after)
    state: dict[str, Any] = field(default_factory=dict)  # slug -> content after it


def _ref(slug: str) -> EntityKey:
    return EntityKey(NS, "item", slug)


def seeded_history(actor: Any, seed: int, steps: int = 45) -> list[Step]:
    """Writes ``steps`` changesets of random ops; returns each with the state after it."""
    rng = random.Random(seed)
    state: dict[str, Any] = {}
    history: list[Step] = []
    while len(history) < steps:
        ops = []
        touched: dict[str, Any] = {}
        for slug in rng.sample(SLUGS, rng.choice([1, 1, 1, 2, 3])):
            now = touched.get(slug, state.get(slug))
            roll = rng.random()
            if now is not None and roll < 0.12:
                ops.append(DeleteOp(_ref(slug)))
                touched[slug] = None
            elif now is not None and roll < 0.3:
                patch = {rng.choice(["a", "b", "z"]): rng.choice([None, 1, {"q": 2}])}
                ops.append(PatchOp(_ref(slug), patch))
                touched[slug] = _merge(now, patch)
            else:
                doc = mutate(rng, now) if now is not None else random_doc(rng)
                doc = doc if isinstance(doc, dict) else {"v": doc}
                ops.append(PutOp(_ref(slug), doc))
                touched[slug] = doc
        result = changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE)
        if result.changeset is None:
            continue
        changes = {r.slug: (r.before, r.after) for r in result.revisions}
        for slug, (_, after) in changes.items():
            if after is None:
                state.pop(slug, None)
            else:
                state[slug] = copy.deepcopy(after)
        history.append(Step(result.changeset, changes, copy.deepcopy(state)))
    return history


def _merge(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    for name, value in patch.items():
        if value is None:
            out.pop(name, None)
        elif isinstance(value, dict):
            out[name] = _merge(out[name] if isinstance(out.get(name), dict) else {}, value)
        else:
            out[name] = value
    return out


def _resolve(doc: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return ABSENT
        doc = doc[part]
    return doc


def _same(a: Any, b: Any) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    return canonical(a) == canonical(b)


def brute_blame(history: list[Step], upto: int, slug: str) -> list[tuple[str, str]]:
    """(pointer, changeset id) per leaf of ``slug`` after ``history[upto]``, by definition."""
    out = []
    for leaf in pointers.leaves(history[upto].state[slug]):
        path = pointers.segments(leaf)
        for step in reversed(history[: upto + 1]):
            if slug in step.changes:
                before, after = step.changes[slug]
                if before is None or not _same(_resolve(before, path), _resolve(after, path)):
                    out.append((leaf, str(step.changeset.id)))
                    break
    return out


def is_walk(sql: str) -> bool:
    """One of blame's statements: a window of the entity's revisions
    (``entity_keys.entity_window``), or the open leaves' posting lists below it
    (``entity_keys.entity_probe``)."""
    return sql.startswith(("WITH win AS MATERIALIZED", "WITH born AS MATERIALIZED"))


def blame_of(client: Any, slug: str, **params: Any) -> Any:
    return client.get(f"{API}/entities/{NS}/item/{slug}/blame", params)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_blame_matches_a_brute_force_replay(api, staff, namespace, seed):
    history = seeded_history(staff, seed)
    checked = 0
    for upto in range(len(history)):
        step = history[upto]
        for slug in SLUGS:
            expected = brute_blame(history, upto, slug) if slug in step.state else None
            response = blame_of(api, slug, as_of=str(step.changeset.id))
            if expected is None:
                assert_problem(response, 404)
                continue
            assert response.status_code == 200, response.content
            body = response.json()
            got = [(k["pointer"], k["changeset_id"]) for k in body["keys"]]
            assert got == expected, (upto, slug, step.state[slug])
            assert body["as_of"]["changeset_id"] == str(step.changeset.id)
            checked += 1
    assert checked > 30
    for slug in SLUGS:  # now, without as_of
        response = blame_of(api, slug)
        if slug not in history[-1].state:
            assert_problem(response, 404)
            continue
        keys = response.json()["keys"]
        assert [(k["pointer"], k["changeset_id"]) for k in keys] == brute_blame(
            history, len(history) - 1, slug
        )
        by_id = {str(s.changeset.id): s.changeset for s in history}
        for k in keys:
            cs = by_id[k["changeset_id"]]
            assert (k["seq"], k["author"], k["at"]) == (cs.seq, "root", rfc3339(cs.at))
        assert [k["pointer"] for k in keys] == sorted(
            (k["pointer"] for k in keys), key=pointers.sort_key
        )


def test_blame_stops_walking_once_every_leaf_is_resolved(api, staff, namespace):
    path = f"{NS}/item/long"
    for i in range(blame_selectors.BLAME_BATCH + 50):
        changeset_apply(
            store=baseline,
            actor=staff,
            ops=[PutOp(EntityKey(*path.split("/")), {"n": i, "m": {"k": 0}})],
            rpc=Rpc.PUT_ENTITY,
        )
    newest = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(EntityKey(*path.split("/")), {"n": -1, "m": {"k": 1}})],
        rpc=Rpc.PUT_ENTITY,
    ).changeset
    with CaptureQueriesContext(connection) as captured:
        response = blame_of(api, "long")
    keys = response.json()["keys"]
    assert {k["changeset_id"] for k in keys} == {str(newest.id)}
    walks = [q for q in captured.captured_queries if is_walk(q["sql"])]
    assert len(walks) == 1, walks


def test_blame_reads_only_the_revisions_that_touched_an_open_leaf(api, staff, namespace):
    """600 revisions change ``/n``; ``/a`` dates from the create and ``/m/k`` from one
    write half-way. Once ``/n`` is resolved, PostgreSQL skips every revision that
    touched no open leaf: two walk statements, where a walk of every revision (a
    Python step each, ``BLAME_BATCH`` a statement) took four."""
    key = EntityKey(NS, "item", "busy")

    def put(doc: dict[str, Any]) -> Changeset:
        return changeset_apply(
            store=baseline, actor=staff, ops=[PutOp(key, doc)], rpc="PutEntity"
        ).changeset

    created = put({"a": 1, "m": {"k": 0}, "n": 0})
    for i in range(1, 300):
        put({"a": 1, "m": {"k": 0}, "n": i})
    middle = put({"a": 1, "m": {"k": 1}, "n": 300})
    for i in range(301, 601):
        newest = put({"a": 1, "m": {"k": 1}, "n": i})
    with CaptureQueriesContext(connection) as captured:
        response = blame_of(api, "busy")
    assert [(k["pointer"], k["changeset_id"]) for k in response.json()["keys"]] == [
        ("/a", str(created.id)),
        ("/m/k", str(middle.id)),
        ("/n", str(newest.id)),
    ]
    walks = [q for q in captured.captured_queries if is_walk(q["sql"])]
    assert len(walks) == 2, [q["sql"] for q in walks]
    # The first statement, the window of the entity's 200 newest revisions, resolves
    # /n; the second, for /a and /m/k below it, reads the two revisions that set them
    # off the posting lists and the entity's creates: not the ~400 below the window.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE changesets_revision")
    plan = analyze(walks[1]["sql"])
    assert not [n for n in nodes(plan) if n.get("Subplan Name") == "CTE win"]
    below = 0
    for node in nodes(plan):
        if node.get("Relation Name", "").startswith("changesets_revision") and node.get(
            "Actual Loops"
        ):
            below += node["Actual Rows"] * node["Actual Loops"]
            below += node.get("Rows Removed by Filter", 0)
    assert below <= 2, below


def test_blame_finds_what_the_create_set_without_reading_the_namespaces_creates(
    api, staff, namespace
):
    """A leaf set at create and never since is found at the entity's newest create
    (off ``revision_creates``), below the updates that touched an open leaf (off
    their own posting lists, migration 0039): not by ANDing the entity's history
    with a posting list that holds every create of the namespace. An earlier life's
    update of that leaf, before a delete, is not the answer.

    The namespace is the test's own: the index still holds the entries of rows
    earlier tests wrote and rolled back (their terms name their namespace)."""
    ns = NamespaceFactory(name=f"blame.creates-{uuid.uuid4().hex[:8]}").name
    key = EntityKey(ns, "item", "busy")

    def write(op: Any) -> Changeset:
        return changeset_apply(store=baseline, actor=staff, ops=[op], rpc="PutEntity").changeset

    changeset_apply(  # 400 creates that set /a, in one changeset
        store=baseline,
        actor=staff,
        ops=[PutOp(EntityKey(ns, "item", f"other-{i}"), {"a": i, "n": 0}) for i in range(400)],
        rpc="BatchMutate",
    )
    write(PutOp(key, {"a": 0, "n": 0}))
    write(PutOp(key, {"a": 1, "n": 0}))  # the earlier life's last write of /a
    write(DeleteOp(key))
    born = write(PutOp(key, {"a": 1, "n": 0}))
    for i in range(1, entity_keys.ENTITY_KEY_WINDOW + 50):
        newest = write(PutOp(key, {"a": 1, "n": i}))
    with CaptureQueriesContext(connection) as captured:
        response = api.get(f"{API}/entities/{ns}/item/busy/blame")
    assert [(k["pointer"], k["changeset_id"]) for k in response.json()["keys"]] == [
        ("/a", str(born.id)),
        ("/n", str(newest.id)),
    ]
    walks = [q for q in captured.captured_queries if is_walk(q["sql"])]
    assert len(walks) == 2, [q["sql"] for q in walks]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE changesets_revision")
        # A partition of a few hundred rows is cheapest read whole: take that plan
        # away, so the question is only which index each part reads.
        cursor.execute("SET LOCAL enable_seqscan = off")
    # Below the window (its own scan, a read of the entity's 200 newest: not counted),
    # the statement reads the two lives' creates and the earlier life's update of /a,
    # each as an index entry and a row: not the 400 other creates of /a.
    reads = []
    for node in _outside_cte(analyze(walks[1]["sql"]), "CTE win"):
        on_revisions = node.get("Relation Name", node.get("Index Name", ""))
        if on_revisions.startswith("changesets_revision") and node.get("Actual Loops"):
            rows = node["Actual Rows"] * node["Actual Loops"]
            reads.append(
                (node["Node Type"], on_revisions, rows, node.get("Rows Removed by Filter", 0))
            )
    assert sum(rows + removed for *_, rows, removed in reads) <= 6, reads


def _outside_cte(node: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """The plan's nodes, but for the subtree of the CTE ``name``."""
    if node.get("Subplan Name") == name:
        return
    yield node
    for child in node.get("Plans", []):
        yield from _outside_cte(child, name)


def test_blame_of_an_emptied_object_and_an_empty_document(api, staff, namespace):
    key = EntityKey(NS, "item", "e")
    first = changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(key, {"a": {"x": 1}, "b": []})], rpc="PutEntity"
    ).changeset
    second = changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(key, {"a": {}, "b": []})], rpc="PutEntity"
    ).changeset
    body = blame_of(api, "e").json()
    assert body["entity"] == {"namespace": NS, "kind": "item", "slug": "e", "version": 2}
    assert [(k["pointer"], k["changeset_id"]) for k in body["keys"]] == [
        ("/a", str(second.id)),
        ("/b", str(first.id)),
    ]
    changeset_apply(store=baseline, actor=staff, ops=[PutOp(key, {})], rpc="PutEntity")
    assert blame_of(api, "e").json()["keys"] == []


def test_blame_refusals(api, staff, namespace, client_for, make_user, write):
    created = write(staff, f"{NS}/item/gone", {"a": 1}).changeset
    write(staff, f"{NS}/item/gone", None)
    write(staff, f"{NS}/item/here", {"a": 1})
    assert_problem(blame_of(api, "nope"), 404)
    assert_problem(blame_of(api, "gone"), 404)
    assert blame_of(api, "gone", as_of=str(created.id)).status_code == 200
    assert_problem(blame_of(api, "here", as_of=str(created.id)), 404)
    assert_problem(blame_of(api, "here", as_of="nope"), 422, error_pointers=["/as_of"])
    assert_problem(blame_of(api, "here", nope="1"), 422)
    stranger = client_for(make_user("stranger", reader=["acme.other"]))
    assert_problem(blame_of(stranger, "here"), 404)


# --- branches -------------------------------------------------------------------------------


@pytest.fixture
def forked(api, staff, namespace, write):
    """o: created on baseline, moved on baseline after the fork, then written on the
    branch (which sees baseline now), then moved on baseline again (shadowed)."""
    write(staff, f"{NS}/item/other", {"k": 1})
    cs1 = write(staff, f"{NS}/item/o", {"a": 1, "b": 1, "c": {"d": 1}}).changeset
    assert api.post(f"{API}/branches", {"name": "feature"}, format="json").status_code == 201
    cs2 = write(staff, f"{NS}/item/o", {"a": 2, "b": 1, "c": {"d": 1}}).changeset
    response = api.patch(
        f"{API}/entities/{NS}/item/o",
        {"patch": {"b": 5}},
        format="json",
        HTTP_X_ATLAS_BRANCH="feature",
    )
    assert response.status_code == 200, response.content
    cs3 = response.json()["changeset"]["id"]
    cs4 = write(staff, f"{NS}/item/o", {"a": 3, "b": 1, "c": {"d": 1}}).changeset
    write(staff, f"{NS}/item/late", {"k": 2})
    return {"cs1": str(cs1.id), "cs2": str(cs2.id), "cs3": cs3, "cs4": str(cs4.id)}


def test_blame_on_a_branch(api, forked):
    on_branch = api.get(f"{API}/entities/{NS}/item/o/blame", HTTP_X_ATLAS_BRANCH="feature")
    assert [(k["pointer"], k["changeset_id"]) for k in on_branch.json()["keys"]] == [
        ("/a", forked["cs2"]),
        ("/b", forked["cs3"]),
        ("/c/d", forked["cs1"]),
    ]
    on_baseline = blame_of(api, "o").json()["keys"]
    assert [(k["pointer"], k["changeset_id"]) for k in on_baseline] == [
        ("/a", forked["cs4"]),
        ("/b", forked["cs1"]),
        ("/c/d", forked["cs1"]),
    ]
    untouched = api.get(f"{API}/entities/{NS}/item/other/blame", HTTP_X_ATLAS_BRANCH="feature")
    assert untouched.json()["keys"] == blame_of(api, "other").json()["keys"]
    pinned = api.get(
        f"{API}/entities/{NS}/item/o/blame",
        {"as_of": forked["cs1"]},
        HTTP_X_ATLAS_BRANCH="feature",
    )
    assert_problem(pinned, 400)


def test_diffs_on_a_branch_run_from_a_baseline_point_to_the_branch_now(api, forked):
    url = f"{API}/entities/{NS}/item/o/diff"
    body = api.get(url, {"from": forked["cs1"]}, HTTP_X_ATLAS_BRANCH="feature").json()
    assert body["to"] is None and body["from"]["changeset_id"] == forked["cs1"]
    assert body["after"] == {"a": 2, "b": 5, "c": {"d": 1}}
    assert_applies(body["before"], body["patch"], body["after"])
    refused = api.get(
        url, {"from": forked["cs1"], "to": forked["cs2"]}, HTTP_X_ATLAS_BRANCH="feature"
    )
    assert_problem(refused, 400)
    assert_problem(api.get(url, {"from": forked["cs3"]}), 400, pointer="/from")  # a branch's
    page = api.get(
        f"{API}/diff", {"namespace": NS, "from": forked["cs1"]}, HTTP_X_ATLAS_BRANCH="feature"
    )
    rows = {r["slug"]: r for r in page.json()["results"]}
    assert {slug: r["op"] for slug, r in rows.items()} == {"o": "update", "late": "create"}
    for row in rows.values():
        assert_applies(row["before"], row["patch"], row["after"])


# --- diffs against the replay -----------------------------------------------------------------


def assert_applies(before: Any, patch: list[dict[str, Any]], after: Any) -> None:
    result = jsonpatch.apply_patch(copy.deepcopy(before), patch)
    assert canonical(result) == canonical(after), (before, patch, after)


@pytest.mark.parametrize("seed", [4, 5])
def test_entity_diffs_match_the_replay_and_their_patches_apply(api, staff, namespace, seed):
    history = seeded_history(staff, seed)
    rng = random.Random(seed)
    for _ in range(40):
        i, j = rng.randrange(len(history)), rng.randrange(len(history))
        slug = rng.choice(SLUGS)
        before, after = history[i].state.get(slug), history[j].state.get(slug)
        response = api.get(
            f"{API}/entities/{NS}/item/{slug}/diff",
            {"from": str(history[i].changeset.id), "to": str(history[j].changeset.id)},
        )
        if before is None and after is None:
            assert_problem(response, 404)
            continue
        body = response.json()
        assert canonical(body["before"]) == canonical(before)
        assert canonical(body["after"]) == canonical(after)
        assert body["to"]["seq"] == history[j].changeset.seq
        assert_applies(before, body["patch"], after)
        assert (body["patch"] == []) == (canonical(before) == canonical(after))
    slug = next(s for s in SLUGS if s in history[-1].state)
    now = api.get(
        f"{API}/entities/{NS}/item/{slug}/diff", {"from": str(history[0].changeset.id)}
    ).json()
    assert now["to"]["changeset_id"] == str(history[-1].changeset.id)
    assert canonical(now["after"]) == canonical(history[-1].state[slug])


def namespace_diff(client: Any, **params: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    params = {"namespace": NS, "page_size": 2, **params}
    while True:
        response = client.get(f"{API}/diff", params)
        assert response.status_code == 200, response.content
        body = response.json()
        rows += body["results"]
        if body["next_page_token"] is None:
            return rows
        params["page_token"] = body["next_page_token"]


@pytest.mark.parametrize("seed", [6, 7])
def test_namespace_diffs_match_the_replay_in_key_order(api, staff, namespace, seed):
    history = seeded_history(staff, seed)
    rng = random.Random(seed)
    for _ in range(8):
        i, j = rng.randrange(len(history)), rng.randrange(len(history))
        rows = namespace_diff(
            api, **{"from": str(history[i].changeset.id), "to": str(history[j].changeset.id)}
        )
        expected = {
            slug: (history[i].state.get(slug), history[j].state.get(slug))
            for slug in SLUGS
            if canonical(history[i].state.get(slug)) != canonical(history[j].state.get(slug))
        }
        assert [r["slug"] for r in rows] == sorted(expected)
        for row in rows:
            before, after = expected[row["slug"]]
            op = "create" if before is None else "delete" if after is None else "update"
            assert row["op"] == op
            assert canonical(row["before"]) == canonical(before)
            assert canonical(row["after"]) == canonical(after)
            assert_applies(before, row["patch"], after)
    # "to" absent is now, pinned by the first page for the pages after it.
    first = api.get(f"{API}/diff", {"namespace": NS, "from": str(history[0].changeset.id)}).json()
    assert first["to"]["changeset_id"] == str(history[-1].changeset.id)


def test_a_sparse_namespace_diff_reads_about_the_keys_its_page_needs(api, staff, namespace):
    """One key in 25 differs: a page of 20 needs about the first 500 keys. Batches grown
    by the share of differing keys seen read at most twice that (growing fourfold
    blindly, the third batch read 1,113 keys for this page); the walk is still complete."""
    keys = [EntityKey(NS, "item", f"k{i:04d}") for i in range(2000)]
    ops = [PutOp(key, {"n": i}) for i, key in enumerate(keys)]
    start = changeset_apply(store=baseline, actor=staff, ops=ops, rpc=Rpc.BATCH_MUTATE)
    changed = [PutOp(key, {"n": -i}) for i, key in enumerate(keys) if i % 25 == 3]
    end = changeset_apply(store=baseline, actor=staff, ops=changed, rpc=Rpc.BATCH_MUTATE)
    params = {"namespace": NS, "from": str(start.changeset.id), "to": str(end.changeset.id)}
    with CaptureQueriesContext(connection) as queries:
        page = api.get(f"{API}/diff", {**params, "page_size": 20}).json()
    assert [r["slug"] for r in page["results"]] == [f"k{i:04d}" for i in range(3, 500, 25)]
    batches = [
        int(re.search(r"LIMIT (\d+)\s*\) c", q["sql"]).group(1))  # type: ignore[union-attr]
        for q in queries.captured_queries
        if "AS differs" in q["sql"]
    ]
    assert len(batches) >= 3  # the page took several batches
    read = sum(batches)
    assert read <= 2 * 500, read
    assert len(namespace_diff(api, **params, page_size=7)) == len(changed)


def test_a_paged_diff_to_now_holds_still_while_writes_land(api, staff, namespace, write):
    start = write(staff, f"{NS}/item/a0", {"v": 0}).changeset
    for i in range(1, 5):
        write(staff, f"{NS}/item/a{i}", {"v": i})
    params: dict[str, Any] = {"namespace": NS, "from": str(start.id), "page_size": 2}
    first = api.get(f"{API}/diff", params).json()
    write(staff, f"{NS}/item/a9", {"v": 9})  # lands between the pages
    params["page_token"] = first["next_page_token"]
    rest = api.get(f"{API}/diff", params).json()
    slugs = [r["slug"] for r in first["results"] + rest["results"]]
    assert slugs == ["a1", "a2", "a3", "a4"]
    assert rest["to"] == first["to"]


def test_diff_filters_and_refusals(api, staff, namespace, write, client_for, make_user):
    start = write(staff, f"{NS}/item/a", {"v": 0}).changeset
    write(staff, f"{NS}/item/b", {"v": 1})
    write(staff, f"{NS}/thing/ab", {"v": 1})
    url = f"{API}/diff"
    since = {"namespace": NS, "from": str(start.id)}
    assert [r["slug"] for r in api.get(url, {**since, "kind": "item"}).json()["results"]] == ["b"]
    prefixed = api.get(url, {**since, "slug_prefix": "a"}).json()["results"]
    assert [(r["kind"], r["slug"]) for r in prefixed] == [("thing", "ab")]
    assert_problem(api.get(url, {"from": str(start.id)}), 422, pointer="/namespace")
    assert_problem(api.get(url, {"namespace": NS}), 422, pointer="/from")
    assert_problem(
        api.get(url, {**since, "from_time": rfc3339(start.at)}), 422, pointer="/from_time"
    )
    assert_problem(api.get(url, {"namespace": NS, "from": "x"}), 422, pointer="/from")
    missing = "0193a1c2-0000-7000-8000-000000000000"
    assert_problem(api.get(url, {"namespace": NS, "from": missing}), 404, pointer="/from")
    stranger = client_for(make_user("stranger", reader=["acme.other"]))
    assert_problem(stranger.get(url, since), 404, pointer="/from")  # cannot see the changeset
    entity = f"{API}/entities/{NS}/item/a/diff"
    assert_problem(api.get(entity, {"from": missing}), 404)
    assert_problem(api.get(f"{API}/entities/{NS}/item/zz/diff", {"from": str(start.id)}), 404)
    assert_problem(stranger.get(entity, {"from": str(start.id)}), 404)
    by_time = api.get(entity, {"from_time": rfc3339(start.at)}).json()
    assert by_time["from"]["seq"] >= start.seq
