"""Changed keys (API.md "Key-level history"): the pointer rule, and every surface that
carries ``changed`` (write answers, history, changesets, revisions, feed, webhook
bodies, NDJSON v2).

The rule is computed in PostgreSQL (``atlas_changed_keys``, migration 0013).
:func:`reference_changed` below is the rule written out in Python, as the
contract words it, and the witness the SQL is pinned to on seeded random
documents.
"""

from __future__ import annotations

import importlib
import json
import random
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from changesets import pointers
from changesets.models import Revision, Rpc, Subscription
from changesets.ops import DeleteOp, PutOp, canonical
from changesets.outbox import payloads
from changesets.selectors import feed
from changesets.services.apply import changeset_apply
from entities.store import baseline
from tests.atlas.test_errors import assert_problem
from tests.changesets.helpers import key

API = "/api/v1"
NS = "acme.orders"
NDJSON = "application/x-ndjson"


def reference_changed(before: dict | None, after: dict | None) -> list[str]:
    """API.md's pointer rule, long-hand: creates and deletes name every top-level
    member; updates the deepest object members whose values differ (arrays and
    scalars as whole JSON values), added and removed members included."""
    if before is None or after is None:
        doc = after if before is None else before
        found = [(name,) for name in doc or {}]
    else:
        found = []
        _walk(before, after, (), found)
    return [pointers.join(path) for path in sorted(found)]


def _walk(b: dict, a: dict, path: tuple[str, ...], found: list[tuple[str, ...]]) -> None:
    for name in set(b) | set(a):
        here = (*path, name)
        if name in b and name in a and isinstance(b[name], dict) and isinstance(a[name], dict):
            if canonical(b[name]) != canonical(a[name]):
                _walk(b[name], a[name], here, found)
        elif name not in b or name not in a or canonical(b[name]) != canonical(a[name]):
            found.append(here)


@pytest.fixture
def api(staff, client_for):
    return client_for(staff)


def put(actor: Any, path: str, content: dict | None) -> Any:
    op = DeleteOp(key(path)) if content is None else PutOp(key(path), content)
    return changeset_apply(store=baseline, actor=actor, ops=[op], rpc=Rpc.PUT_ENTITY)


# --- the rule, case by case ----------------------------------------------------------------

CASES = [
    pytest.param(
        {"a": {"b": {"c": 1, "d": 2}}, "e": 1},
        {"a": {"b": {"c": 2, "d": 2}}, "e": 1},
        ["/a/b/c"],
        id="nested-objects-deepest-member",
    ),
    pytest.param({"tags": ["x", "y"]}, {"tags": ["x", "z"]}, ["/tags"], id="array-whole-value"),
    pytest.param({"a": [{"b": 1}]}, {"a": [{"b": 2}]}, ["/a"], id="objects-in-arrays-whole"),
    pytest.param({"a": {"b": 1}}, {"a": 5}, ["/a"], id="object-to-scalar"),
    pytest.param({"a": 1}, {"a": 1.0}, ["/a"], id="int-to-float"),
    pytest.param({"a": 1}, {"a": True}, ["/a"], id="int-to-bool"),
    pytest.param({"a": "1"}, {"a": 1}, ["/a"], id="string-to-int"),
    pytest.param({"a": {}}, {"a": []}, ["/a"], id="empty-object-to-empty-array"),
    pytest.param({"a": None}, {"a": {}}, ["/a"], id="null-to-object"),
    pytest.param({"a": {"x": 1}}, {"a": {"y": 1}}, ["/a/x", "/a/y"], id="member-renamed"),
    pytest.param({"a": 1}, {"a": 1, "b": {"c": 1}}, ["/b"], id="member-added"),
    pytest.param({"a": 1, "b": {"c": 1}}, {"a": 1}, ["/b"], id="member-removed"),
    pytest.param({"a": {}}, {"a": {"x": {"y": 1}}}, ["/a/x"], id="empty-object-filled"),
    pytest.param({"a": {"x": 1}}, {"a": {}}, ["/a/x"], id="object-emptied"),
    pytest.param(None, {"b": 1, "a": {"x": 1}}, ["/a", "/b"], id="create-top-level-members"),
    pytest.param({"b": 1, "a": {"x": 1}}, None, ["/a", "/b"], id="delete-top-level-members"),
    pytest.param(None, {}, [], id="create-empty"),
    pytest.param(
        {"a/b": 1, "m~n": 1, "~1": 1},
        {"a/b": 2, "m~n": 2, "~1": 2},
        ["/a~1b", "/m~0n", "/~01"],
        id="escaping",
    ),
    pytest.param(
        {"a": {"b": 1}, "a!": 1, "a/b": 1, "z": 1, "é": 1, "": 1},
        {"a": {"b": 2}, "a!": 2, "a/b": 2, "z": 2, "é": 2, "": 2},
        ["/", "/a/b", "/a!", "/a~1b", "/z", "/é"],
        id="sorted-by-unescaped-segments-in-code-point-order",
    ),
]


@pytest.mark.parametrize(("before", "after", "expected"), CASES)
def test_changed_keys_follow_the_pointer_rule(staff, namespace, before, after, expected):
    assert reference_changed(before, after) == expected  # the witness agrees with the contract
    path = f"{NS}/order/o-1"
    if before is not None:
        put(staff, path, before)
    result = put(staff, path, after)
    row = Revision.objects.get(changeset=result.changeset)
    assert row.changed == expected
    assert [r.changed for r in result.revisions] == [expected]
    with connection.cursor() as cursor:  # one text, joined by "~2" (migration 0035)
        cursor.execute(
            "SELECT changed, string_to_array(changed, '~2') FROM changesets_revision WHERE id = %s",
            [row.id],
        )
        stored, split = cursor.fetchone()
    assert (stored, split) == ("~2".join(expected), expected)


def test_sorting_is_by_segments_not_by_escaped_text():
    pointers_ = ["/a~1b", "/a!", "/a/b", "/é", "/z"]
    assert sorted(pointers_, key=pointers.sort_key) == ["/a/b", "/a!", "/a~1b", "/z", "/é"]
    assert sorted(pointers_) != sorted(pointers_, key=pointers.sort_key)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("", True),
        ("/", True),
        ("/a/b", True),
        ("/a~0b/~1", True),
        ("/é/0", True),
        ("a", False),
        ("/a~", False),
        ("/a~2", False),
        ("/a\x00", False),
        ("/" + "x" * 2000, False),
    ],
)
def test_pointer_syntax(value, ok):
    assert pointers.is_pointer(value) is ok


# --- the SQL against the witness, on seeded random documents --------------------------------

NAMES = ["a", "b", "a!", "a/b", "m~n", "", "é", "z"]


def random_value(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.35:
        return random_doc(rng, depth + 1)
    choices: list[Any] = [
        0,
        1,
        1.0,
        1.5,
        True,
        False,
        None,
        "1",
        "x",
        [],
        {},
        [1, 2],
        [{"a": 1}],
    ]
    return rng.choice(choices)


def random_doc(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    return {name: random_value(rng, depth) for name in rng.sample(NAMES, rng.randint(0, 5))}


def mutate(rng: random.Random, doc: Any, depth: int = 0) -> Any:
    """A near copy of ``doc``: a few members changed, added, removed or recursed into."""
    if not isinstance(doc, dict) or rng.random() < 0.15:
        return random_value(rng, depth)
    out = dict(doc)
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(NAMES)
        roll = rng.random()
        if roll < 0.25 and name in out:
            del out[name]
        elif roll < 0.6 and isinstance(out.get(name), dict):
            out[name] = mutate(rng, out[name], depth + 1)
        else:
            out[name] = random_value(rng, depth + 1)
    return out


def sql_changed(before: dict | None, after: dict | None) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT atlas_changed_keys(%s::jsonb, %s::jsonb)",
            [
                None if before is None else json.dumps(before),
                None if after is None else json.dumps(after),
            ],
        )
        return cursor.fetchone()[0]


@pytest.mark.parametrize("seed", range(4))
def test_the_sql_rule_matches_the_witness_on_random_documents(db, seed):
    rng = random.Random(seed)
    for _ in range(150):
        before = random_doc(rng)
        after = mutate(rng, before) if rng.random() < 0.8 else random_doc(rng)
        if not isinstance(after, dict):
            after = random_doc(rng)
        for b, a in ((before, after), (None, after), (before, None)):
            assert sql_changed(b, a) == reference_changed(b, a), (b, a)


def test_a_batch_computes_every_revisions_changed_keys_in_one_statement(staff, namespace):
    rng = random.Random(7)
    befores = {f"o-{i}": random_doc(rng) for i in range(60)}
    changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(key(f"{NS}/order/{slug}"), doc) for slug, doc in befores.items()],
        rpc=Rpc.BATCH_MUTATE,
    )
    afters = {slug: mutate(rng, doc) for slug, doc in befores.items()}
    afters = {slug: doc if isinstance(doc, dict) else {"x": 1} for slug, doc in afters.items()}
    result = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(key(f"{NS}/order/{slug}"), doc) for slug, doc in afters.items()],
        rpc=Rpc.BATCH_MUTATE,
    )
    rows = {r.slug: r.changed for r in Revision.objects.filter(changeset=result.changeset)}
    for revision in result.revisions:
        expected = reference_changed(befores[revision.slug], afters[revision.slug])
        assert rows[revision.slug] == revision.changed == expected


def test_the_migration_backfills_changed_keys_in_batches(staff, namespace, monkeypatch):
    put(staff, f"{NS}/order/a", {"x": {"y": 1}, "z": 1})
    put(staff, f"{NS}/order/a", {"x": {"y": 2}, "z": 1})
    put(staff, f"{NS}/order/b", {"k": 1})
    expected = dict(Revision.objects.values_list("id", "changed"))
    with connection.cursor() as cursor:
        # The writes above left deferred foreign-key checks queued; ALTER TABLE waits for none.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE changesets_revision DISABLE TRIGGER revision_append_only")
        # 0013 runs at its own schema, where ``changed`` was a text[] (0035 joins it into
        # one text) and the before image a column (0029 stores it as what differs from
        # after): give the table both back for the backfill. The key index goes first
        # (the test's transaction brings it back): its expression takes the text
        # column (migration 0039's ``atlas_key_terms`` has no text[] form).
        cursor.execute("DROP INDEX revision_changed_keys")
        cursor.execute(
            "ALTER TABLE changesets_revision ALTER COLUMN changed TYPE text[]"
            " USING string_to_array(changed, '~2')"
        )
        cursor.execute("UPDATE changesets_revision SET changed = '{}'")
        cursor.execute("ALTER TABLE changesets_revision ADD COLUMN before jsonb")
        cursor.execute(
            "UPDATE changesets_revision SET before = atlas_before_image(op, after, undo, undo_gone)"
        )
        cursor.execute("ALTER TABLE changesets_revision ENABLE TRIGGER revision_append_only")
    migration = importlib.import_module("changesets.migrations.0013_revision_changed")
    monkeypatch.setattr(migration, "BATCH", 2)  # several batches for three rows

    migration.backfill(None, SimpleNamespace(connection=connection))
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE changesets_revision ALTER COLUMN changed TYPE text"
            " USING array_to_string(changed, '~2')"
        )
    assert dict(Revision.objects.values_list("id", "changed")) == expected
    assert expected and all(expected.values())
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Revision.objects.filter(pk__in=list(expected)).update(changed=[])  # the guard is back


# --- every surface carries it -------------------------------------------------------------


def test_write_answers_history_and_changesets_carry_changed(api, staff, namespace):
    url = f"{API}/entities/{NS}/order/o-1"
    created = api.put(url, {"content": {"b": 1, "a": {"x": 1}}}, format="json")
    assert created.status_code == 201
    assert created.json()["changeset"]["ops"][0]["changed"] == ["/a", "/b"]
    updated = api.put(url, {"content": {"b": 1, "a": {"x": 2}}}, format="json")
    changeset_id = updated.json()["changeset"]["id"]
    assert updated.json()["changeset"]["ops"][0]["changed"] == ["/a/x"]

    history = api.get(f"{url}/history").json()["results"]
    assert [r["changed"] for r in history] == [["/a/x"], ["/a", "/b"]]
    detail = api.get(f"{API}/changesets/{changeset_id}").json()
    assert detail["ops"][0]["changed"] == ["/a/x"]
    listed = api.get(f"{API}/changesets").json()["results"]
    assert [c["ops"][0]["changed"] for c in listed] == [["/a/x"], ["/a", "/b"]]
    revisions = api.get(f"{API}/changesets/{changeset_id}/revisions").json()["results"]
    assert revisions[0]["changed"] == ["/a/x"]
    deleted = api.delete(url)
    assert deleted.json()["changeset"]["ops"][0]["changed"] == ["/a", "/b"]


def test_feed_records_and_webhook_bodies_carry_changed(api, staff, namespace):
    put(staff, f"{NS}/order/o-1", {"a": 1, "b": {"c": 1}})
    put(staff, f"{NS}/order/o-1", {"a": 1, "b": {"c": 2}})
    for capture in ("new_values", "new_row", "old_and_new_values"):
        records = api.get(f"{API}/changes", {"capture": capture}).json()["records"]
        assert [r["changed"] for r in records] == [["/a", "/b"], ["/b/c"]]
    sub = Subscription.objects.create(name="s", url="https://example.invalid/h", secret="k")
    page = feed.feed_page(after_seq=0, namespaces=None)
    body = json.loads(payloads.plan_delivery(sub, page).body)
    assert [r["changed"] for r in body["records"]] == [["/a", "/b"], ["/b/c"]]


# --- NDJSON version 2 -----------------------------------------------------------------------


def _export(api: Any, changeset_id: Any) -> list[dict[str, Any]]:
    response = api.get(f"{API}/changesets/{changeset_id}/export")
    assert response.status_code == 200
    text = b"".join(response.streaming_content).decode()
    return [json.loads(line) for line in text.splitlines()]


def test_export_is_version_2_and_op_lines_carry_changed(api, staff, namespace):
    put(staff, f"{NS}/order/o-1", {"a": {"x": 1}})
    result = put(staff, f"{NS}/order/o-1", {"a": {"x": 2}})
    envelope, op = _export(api, result.changeset.id)
    assert envelope["schema_version"] == 2
    assert op["changed"] == ["/a/x"]


def test_import_round_trip_recomputes_changed_and_ignores_a_given_one(api, staff, namespace):
    put(staff, f"{NS}/order/o-1", {"a": {"x": 1}})
    result = put(staff, f"{NS}/order/o-1", {"a": {"x": 2}, "b": 1})
    envelope, op = _export(api, result.changeset.id)
    put(staff, f"{NS}/order/o-1", {"a": {"x": 1}})  # back to the file's before
    op["changed"] = ["/bogus"]
    text = "\n".join(json.dumps(line) for line in (envelope, op)) + "\n"
    response = api.post(f"{API}/changesets/import", data=text, content_type=NDJSON)
    assert response.status_code == 200, response.content
    imported = response.json()["changeset"]
    assert imported["ops"][0]["changed"] == ["/a/x", "/b"]
    assert Revision.objects.get(changeset_id=imported["id"]).changed == ["/a/x", "/b"]


def _file(version: int, **op_extra: Any) -> str:
    envelope = {
        "schema_version": version,
        "changeset_id": str(uuid.uuid4()),
        "author": "someone",
        "at": "2026-01-02T03:04:05.678Z",
        "rpc": "PutEntity",
        "branch": "",
        "comment": "",
    }
    op = {"op": "create", "namespace": NS, "kind": "order", "slug": "o-9", "before": None}
    op |= {"after": {"k": 1}, **op_extra}
    return json.dumps(envelope) + "\n" + json.dumps(op) + "\n"


def test_import_still_reads_version_1(api, staff, namespace):
    response = api.post(f"{API}/changesets/import", data=_file(1), content_type=NDJSON)
    assert response.status_code == 200, response.content
    assert response.json()["changeset"]["ops"][0]["changed"] == ["/k"]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        pytest.param(_file(1, changed=["/k"]), 2, id="changed-is-unknown-in-version-1"),
        pytest.param(_file(3), 1, id="version-3"),
    ],
)
def test_import_refuses_what_its_version_does_not_define(api, staff, namespace, text, line):
    response = api.post(f"{API}/changesets/import", data=text, content_type=NDJSON)
    assert_problem(response, 400, pointer=f"/line/{line}")
