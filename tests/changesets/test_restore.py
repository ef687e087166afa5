"""Restore: an entity (by version, ``as_of``, ``as_of_time``) or a scope, as one changeset.

API.md "Restore and key-level merge (added)" and "Decisions for the added
sections": entity restore answers 201 when it re-creates, 200 otherwise, and
``changeset: null`` when already equal; an unknown version is 404; a scope
restore is one ``RestoreScope`` changeset of at most ``ATLAS_MAX_BATCH_OPS``
ops (413 beyond, dry runs too); reverting it gives back exactly the state
before it. Service tests call ``changesets.services.restore``; API tests go
through real HTTP with token auth. The property test at the end runs both
over seeded random histories built through the service layer.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atlas.exceptions import PayloadTooLarge
from branches.services import branch_create
from branches.store import BranchStore
from changesets.exceptions import RestoreConflict
from changesets.models import Changeset, Revision, Rpc
from changesets.ops import DeleteOp, PutOp, canonical
from changesets.selectors.asof import entities_as_of
from changesets.services import restore as restore_service
from changesets.services.apply import changeset_apply
from changesets.services.restore import entity_restore, scope_restore
from changesets.services.revert import changeset_revert
from entities.services import role_grant
from entities.store import EntityKey, baseline
from tests.atlas.test_errors import assert_problem
from tests.changesets.helpers import (
    assert_json_identical,
    assert_nothing_written,
    assert_revision,
    entity_table,
    key,
    log_snapshot,
    only_revision,
    replayed_table,
)
from tests.changesets.test_concurrency import run_in_threads
from tests.entities.factories import NamespaceFactory

API = "/api/v1"
NS = "acme.orders"
A = f"{NS}/order/a"
B = f"{NS}/order/b"
C = f"{NS}/order/c"


def put(actor: Any, path: str, content: dict[str, Any], **kw: Any) -> Changeset:
    result = changeset_apply(
        store=baseline, actor=actor, ops=[PutOp(key(path), content)], rpc=Rpc.PUT_ENTITY, **kw
    )
    assert result.changeset is not None
    return result.changeset


def delete(actor: Any, path: str) -> Changeset:
    result = changeset_apply(
        store=baseline, actor=actor, ops=[DeleteOp(key(path))], rpc=Rpc.DELETE_ENTITY
    )
    assert result.changeset is not None
    return result.changeset


def restore_url(path: str) -> str:
    return f"{API}/entities/{path}/restore"


def now_of(path: str) -> tuple[str, int] | None:
    entity = baseline.get(key(path))
    return (canonical(entity.content), entity.version) if entity else None


# --- restore an entity ---------------------------------------------------------------


def test_restore_by_version_puts_that_content_back_as_a_new_version(writer, client_for, namespace):
    put(writer, A, {"title": "one", "n": 1})
    put(writer, A, {"title": "two"})
    put(writer, A, {"title": "three", "extra": True})
    response = client_for(writer).post(restore_url(A), {"version": 1}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "updated" and body["restored_version"] == 1
    assert body["dry_run"] is False and response["ETag"] == '"4"'
    assert_json_identical(body["entity"]["content"], {"title": "one", "n": 1})
    assert body["entity"]["version"] == 4
    changeset = Changeset.objects.get(pk=body["changeset"]["id"])
    assert changeset.rpc == Rpc.RESTORE_ENTITY and changeset.author_name == writer.username
    assert_revision(
        only_revision(changeset),
        op="update",
        before={"title": "three", "extra": True},
        after={"title": "one", "n": 1},
        before_version=3,
        after_version=4,
    )


def test_restore_re_creates_a_deleted_entity_with_201_and_continues_its_versions(
    writer, client_for, namespace
):
    put(writer, A, {"title": "one"})
    put(writer, A, {"title": "two"})
    delete(writer, A)
    response = client_for(writer).post(restore_url(A), {"version": 2}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "created" and body["entity"]["version"] == 3
    assert_revision(
        only_revision(Changeset.objects.get(pk=body["changeset"]["id"])),
        op="create",
        before=None,
        after={"title": "two"},
        after_version=3,
    )
    assert entity_table() == replayed_table()


def test_restore_as_of_a_point_before_the_entity_existed_deletes_it(writer, client_for, namespace):
    first = put(writer, B, {"other": 1})
    put(writer, A, {"title": "new"})
    response = client_for(writer).post(restore_url(A), {"as_of": str(first.id)}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "deleted" and body["entity"] is None
    assert body["restored_version"] is None
    assert body["as_of"]["changeset_id"] == str(first.id) and body["as_of"]["seq"] == first.seq
    assert baseline.get(key(A)) is None


def test_restore_as_of_time_takes_the_newest_changeset_then(writer, client_for, namespace):
    put(writer, A, {"v": 1})
    second = put(writer, A, {"v": 2})
    put(writer, A, {"v": 3})
    at = second.at.isoformat().replace("+00:00", "Z")
    response = client_for(writer).post(restore_url(A), {"as_of_time": at}, format="json")
    assert response.status_code == 200, response.content
    assert_json_identical(response.json()["entity"]["content"], {"v": 2})
    assert response.json()["as_of"]["changeset_id"] == str(second.id)


def test_restore_to_what_it_already_holds_writes_nothing(writer, client_for, namespace):
    put(writer, A, {"v": 1})
    put(writer, A, {"v": 2})
    put(writer, A, {"v": 1})
    before = log_snapshot()
    response = client_for(writer).post(restore_url(A), {"version": 1}, format="json")
    assert response.status_code == 200
    assert response.json()["changeset"] is None and response.json()["status"] == "unchanged"
    assert_nothing_written(before)


def test_restore_of_an_absent_entity_to_a_point_it_was_absent_writes_nothing(
    writer, client_for, namespace
):
    first = put(writer, B, {"x": 1})
    put(writer, A, {"v": 1})
    delete(writer, A)
    before = log_snapshot()
    response = client_for(writer).post(restore_url(A), {"as_of": str(first.id)}, format="json")
    assert response.status_code == 200
    assert response.json()["status"] == "unchanged" and response.json()["changeset"] is None
    assert_nothing_written(before)


def test_unknown_version_and_never_existing_entity_are_404(writer, client_for, namespace):
    put(writer, A, {"v": 1})
    client = client_for(writer)
    assert_problem(client.post(restore_url(A), {"version": 7}, format="json"), 404)
    first = Changeset.objects.get()
    missing = f"{NS}/order/never"
    assert_problem(client.post(restore_url(missing), {"version": 1}, format="json"), 404)
    assert_problem(client.post(restore_url(missing), {"as_of": str(first.id)}, format="json"), 404)
    assert_problem(
        client.post(restore_url(A), {"as_of": str(uuid.uuid4())}, format="json"),
        404,
        pointer="/as_of",
    )


def test_if_match_is_judged_against_the_entity_now(writer, client_for, namespace):
    put(writer, A, {"v": 1})
    put(writer, A, {"v": 2})
    client = client_for(writer)
    before = log_snapshot()
    stale = client.post(restore_url(A), {"version": 1}, format="json", HTTP_IF_MATCH='"1"')
    assert_problem(stale, 412)
    assert_nothing_written(before)
    assert_problem(
        client.post(restore_url(A), {"version": 1}, format="json", HTTP_IF_MATCH="2"), 422
    )
    ok = client.post(restore_url(A), {"version": 1}, format="json", HTTP_IF_MATCH='"2"')
    assert ok.status_code == 200 and ok.json()["entity"]["version"] == 3


def test_if_match_on_a_deleted_entity_is_412(writer, client_for, namespace):
    put(writer, A, {"v": 1})
    delete(writer, A)
    response = client_for(writer).post(
        restore_url(A), {"version": 1}, format="json", HTTP_IF_MATCH='"1"'
    )
    assert_problem(response, 412)


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({}, "/version"),
        ({"version": 1, "as_of_time": "2026-01-01T00:00:00Z"}, "/as_of_time"),
        ({"version": "1"}, "/version"),
        ({"version": True}, "/version"),
        ({"version": 0}, "/version"),
        ({"as_of": "nope"}, "/as_of"),
        ({"as_of_time": "yesterday"}, "/as_of_time"),
        ({"version": 1, "surprise": 1}, "/surprise"),
    ],
)
def test_a_bad_restore_body_is_422(writer, client_for, namespace, body, pointer):
    put(writer, A, {"v": 1})
    response = client_for(writer).post(restore_url(A), body, format="json")
    problem = assert_problem(response, 422)
    assert pointer in [e["pointer"] for e in problem["errors"]]


def test_a_dry_run_reports_and_writes_nothing(writer, client_for, namespace):
    put(writer, A, {"v": 1})
    delete(writer, A)
    before = log_snapshot()
    response = client_for(writer).post(
        restore_url(A), {"version": 1, "dry_run": True}, format="json"
    )
    assert response.status_code == 200  # 201 only when it did re-create
    body = response.json()
    assert body["dry_run"] is True and body["status"] == "created" and body["changeset"] is None
    assert_json_identical(body["entity"]["content"], {"v": 1})
    assert_nothing_written(before)


def test_a_reader_gets_403_and_an_outsider_404(make_user, writer, client_for, namespace):
    put(writer, A, {"v": 1})
    put(writer, A, {"v": 2})
    reader = make_user("rita", reader=[NS])
    outsider = make_user("otto", reader=["acme.other"])
    assert_problem(client_for(reader).post(restore_url(A), {"version": 1}, format="json"), 403)
    assert_problem(client_for(outsider).post(restore_url(A), {"version": 1}, format="json"), 404)


def test_comment_and_metadata_land_on_the_changeset(writer, client_for, namespace):
    put(writer, A, {"v": 1})
    put(writer, A, {"v": 2})
    response = client_for(writer).post(
        restore_url(A),
        {"version": 1, "comment": "roll back", "metadata": {"ticket": "T-1"}},
        format="json",
    )
    changeset = Changeset.objects.get(pk=response.json()["changeset"]["id"])
    assert changeset.comment == "roll back" and changeset.metadata == {"ticket": "T-1"}


def test_restore_under_a_branch_is_staged_on_the_branch(writer, client_for, namespace):
    put(writer, A, {"v": 1})
    put(writer, A, {"v": 2})
    branch_create(name="fix", actor=writer)
    response = client_for(writer).post(
        restore_url(A), {"version": 1}, format="json", HTTP_X_ATLAS_BRANCH="fix"
    )
    assert response.status_code == 200, response.content
    assert Changeset.objects.get(pk=response.json()["changeset"]["id"]).branch == "fix"
    assert_json_identical(baseline.get(key(A)).content, {"v": 2})  # baseline untouched
    read = client_for(writer).get(f"{API}/entities/{A}", HTTP_X_ATLAS_BRANCH="fix")
    assert_json_identical(read.json()["content"], {"v": 1})


def test_entity_restore_then_revert_gives_back_the_prior_state(writer, namespace):
    put(writer, A, {"v": 1})
    put(writer, A, {"v": 2, "deep": {"x": [1, 2]}})
    before = entity_table()
    done = entity_restore(store=baseline, actor=writer, key=key(A), version=1)
    changeset_revert(store=baseline, actor=writer, changeset=done.applied.changeset)
    after = entity_table()
    assert {k: c for k, (c, _) in after.items()} == {k: c for k, (c, _) in before.items()}


# --- restore a scope -----------------------------------------------------------------


def scope(writer: Any) -> dict[str, Changeset]:
    """a, b exist at ``point``; then a changes, b is deleted, c is created."""
    put(writer, A, {"v": "a1"})
    point = put(writer, B, {"v": "b1"})
    put(writer, f"{NS}/invoice/i", {"v": "i1"})
    put(writer, A, {"v": "a2"})
    delete(writer, B)
    put(writer, C, {"v": "c1"})
    put(writer, f"{NS}/invoice/i", {"v": "i2"})
    return {"point": point}


def test_restore_scope_creates_updates_and_deletes_in_one_changeset(writer, client_for, namespace):
    point = scope(writer)["point"]
    response = client_for(writer).post(
        f"{API}/restore",
        {"namespace": NS, "kind": "order", "as_of": str(point.id), "comment": "back"},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is False and body["as_of"]["seq"] == point.seq
    assert [(o["op"], o["slug"]) for o in body["ops"]] == [
        ("put", "a"),
        ("put", "b"),
        ("delete", "c"),
    ]
    changeset = Changeset.objects.get(pk=body["changeset"]["id"])
    assert changeset.rpc == Rpc.RESTORE_SCOPE and changeset.op_count == 3
    ops = {r.slug: r.op for r in Revision.objects.filter(changeset=changeset)}
    assert ops == {"a": "update", "b": "create", "c": "delete"}
    assert_json_identical(baseline.get(key(A)).content, {"v": "a1"})
    assert_json_identical(baseline.get(key(B)).content, {"v": "b1"})
    assert baseline.get(key(C)) is None
    assert_json_identical(baseline.get(key(f"{NS}/invoice/i")).content, {"v": "i2"})  # not in scope
    assert entity_table() == replayed_table()


def test_restore_scope_narrows_by_slug_prefix(writer, client_for, namespace):
    point = scope(writer)["point"]
    response = client_for(writer).post(
        f"{API}/restore",
        {"namespace": NS, "slug_prefix": "b", "as_of": str(point.id)},
        format="json",
    )
    assert [(o["op"], o["slug"]) for o in response.json()["ops"]] == [("put", "b")]
    assert baseline.get(key(C)) is not None


def test_restore_scope_by_time_and_dry_run_writes_nothing(writer, client_for, namespace):
    point = scope(writer)["point"]
    before = log_snapshot()
    response = client_for(writer).post(
        f"{API}/restore",
        {
            "namespace": NS,
            "as_of_time": point.at.isoformat().replace("+00:00", "Z"),
            "dry_run": True,
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is True and body["changeset"] is None and len(body["ops"]) == 4
    assert_nothing_written(before)


def test_restore_scope_to_the_current_state_writes_nothing(writer, client_for, namespace):
    scope(writer)
    head = Changeset.objects.order_by("-seq").first()
    before = log_snapshot()
    response = client_for(writer).post(
        f"{API}/restore", {"namespace": NS, "as_of": str(head.id)}, format="json"
    )
    assert response.status_code == 200
    assert response.json() == {
        "changeset": None,
        "ops": [],
        "dry_run": False,
        "as_of": response.json()["as_of"],
    }
    assert_nothing_written(before)


def test_restore_scope_over_the_op_limit_is_413_dry_run_too(
    writer, client_for, namespace, settings
):
    point = scope(writer)["point"]
    settings.ATLAS_MAX_BATCH_OPS = 3
    before = log_snapshot()
    for dry_run in (True, False):
        response = client_for(writer).post(
            f"{API}/restore",
            {"namespace": NS, "as_of": str(point.id), "dry_run": dry_run},
            format="json",
        )
        problem = assert_problem(response, 413)
        assert problem["op_count"] == 4 and problem["limit"] == 3
    assert_nothing_written(before)
    narrowed = client_for(writer).post(
        f"{API}/restore", {"namespace": NS, "kind": "order", "as_of": str(point.id)}, format="json"
    )
    assert narrowed.status_code == 200


def test_on_a_branch_a_scope_over_the_read_limit_is_413(writer, namespace, monkeypatch):
    point = scope(writer)["point"]
    store = BranchStore(branch_create(name="fix", actor=writer), writer=writer)
    monkeypatch.setattr(restore_service, "MAX_SCOPE_ENTITIES", 2)
    with pytest.raises(PayloadTooLarge, match="narrow it"):
        scope_restore(store=store, actor=writer, namespace=NS, as_of=point)


def test_restore_scope_on_a_branch_is_staged_there(writer, namespace):
    point = scope(writer)["point"]
    store = BranchStore(branch_create(name="fix", actor=writer), writer=writer)
    done = scope_restore(store=store, actor=writer, namespace=NS, kind="order", as_of=point)
    assert done.changeset is not None and done.changeset.branch == "fix"
    assert [op["slug"] for op in done.ops] == ["a", "b", "c"]
    assert_json_identical(store.get(key(A)).content, {"v": "a1"})
    assert store.get(key(C)) is None and baseline.get(key(C)) is not None


def test_restore_scope_visibility_and_roles(make_user, writer, client_for, namespace):
    point = scope(writer)["point"]
    reader = make_user("rita", reader=[NS])
    outsider = make_user("otto", reader=["acme.other"])
    body = {"namespace": NS, "as_of": str(point.id)}
    assert_problem(client_for(reader).post(f"{API}/restore", body, format="json"), 403)
    assert_problem(
        client_for(outsider).post(f"{API}/restore", body, format="json"), 404, pointer="/namespace"
    )
    assert_problem(
        client_for(writer).post(
            f"{API}/restore", {"namespace": "acme.none", "as_of": str(point.id)}, format="json"
        ),
        404,
    )
    assert_problem(
        client_for(writer).post(
            f"{API}/restore", {"namespace": NS, "as_of": str(uuid.uuid4())}, format="json"
        ),
        404,
        pointer="/as_of",
    )
    problem = assert_problem(
        client_for(writer).post(f"{API}/restore", {"namespace": NS}, format="json"), 422
    )
    assert problem["errors"][0]["pointer"] == "/as_of"


def test_restore_scope_then_revert_gives_back_exactly_the_state_before(writer, namespace):
    point = scope(writer)["point"]
    before = entity_table()
    done = scope_restore(store=baseline, actor=writer, namespace=NS, as_of=point)
    assert done.changeset is not None
    changeset_revert(store=baseline, actor=writer, changeset=done.changeset)
    after = entity_table()
    assert {k: c for k, (c, _) in after.items()} == {k: c for k, (c, _) in before.items()}
    assert entity_table() == replayed_table()


def test_a_scope_restore_costs_a_fixed_number_of_queries(
    writer, namespace, django_assert_max_num_queries
):
    for i in range(30):
        put(writer, f"{NS}/order/o{i:02}", {"i": i})
    point = Changeset.objects.order_by("-seq").first()
    for i in range(30):
        put(writer, f"{NS}/order/o{i:02}", {"i": i, "changed": True})
    with django_assert_max_num_queries(12):
        done = scope_restore(store=baseline, actor=writer, namespace=NS, as_of=point)
    assert done.changeset is not None and done.changeset.op_count == 30


# --- concurrency: a write racing the restore -----------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_write_landing_between_plan_and_lock_refuses_the_restore(writer, namespace, monkeypatch):
    point = scope(writer)["point"]
    planned, raced = threading.Event(), threading.Event()
    real_changes = restore_service.scope_changes

    def pausing_changes(**kw: Any) -> Any:
        found = real_changes(**kw)  # step 2: what differs, and each key's version now
        planned.set()
        assert raced.wait(20)
        return found

    monkeypatch.setattr(restore_service, "scope_changes", pausing_changes)

    def restore() -> Any:
        return scope_restore(store=baseline, actor=writer, namespace=NS, as_of=point)

    def racer() -> Any:
        assert planned.wait(20)
        try:
            return changeset_apply(
                store=baseline, actor=writer, ops=[PutOp(key(A), {"v": "racer"})], rpc="PutEntity"
            )
        finally:
            raced.set()

    before_count = Changeset.objects.count()
    restored, won = run_in_threads(restore, racer)
    assert isinstance(restored, RestoreConflict), restored
    assert restored.conflicts == [
        {
            "namespace": NS,
            "kind": "order",
            "slug": "a",
            "reason": "moved_on",
            "newer_changeset_id": str(won.changeset.id),
        }
    ]
    assert Changeset.objects.count() == before_count + 1  # the racer's only
    assert_json_identical(baseline.get(key(A)).content, {"v": "racer"})
    assert baseline.get(key(B)) is None  # nothing of the restore landed


@pytest.mark.django_db(transaction=True)
def test_if_match_restores_race_and_exactly_one_wins(writer, namespace):
    put(writer, A, {"v": 1})
    put(writer, A, {"v": 2})
    barrier = threading.Barrier(2, timeout=20)

    def restore(version: int) -> Any:
        def run() -> Any:
            barrier.wait()
            return entity_restore(
                store=baseline, actor=writer, key=key(A), version=version, if_match=2
            )

        return run

    outcomes = run_in_threads(restore(1), restore(1))
    wins = [o for o in outcomes if not isinstance(o, BaseException)]
    losses = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(wins) == 1 and len(losses) == 1
    assert getattr(losses[0], "status", None) == 412
    assert now_of(A) == (canonical({"v": 1}), 3)


# --- property: restore, then revert, over random histories ---------------------------

SLUGS = ["a", "b", "c", "d"]
contents = st.dictionaries(
    st.sampled_from(["x", "y", "z"]),
    st.one_of(st.integers(-3, 3), st.booleans(), st.text(max_size=3), st.just(1.0)),
    max_size=3,
)
steps = st.lists(
    st.lists(
        st.tuples(st.sampled_from(SLUGS), st.one_of(st.none(), contents)),
        min_size=1,
        max_size=3,
    ),
    min_size=1,
    max_size=6,
)
_counter = iter(range(10**9))


def _apply_step(actor: Any, ns: str, step: list[tuple[str, Any]]) -> Changeset | None:
    """One changeset from a step; a delete of a missing key is skipped (``missing_ok``)."""
    ops = [
        DeleteOp(EntityKey(ns, "t", slug), missing_ok=True)
        if body is None
        else PutOp(EntityKey(ns, "t", slug), body)
        for slug, body in step
    ]
    return changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE).changeset


def _state(ns: str) -> dict[str, str]:
    return {k.slug: c for k, (c, _) in entity_table([ns]).items()}


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(history=steps, pick=st.integers(0, 10**6), whole=st.booleans())
def test_restore_then_revert_gives_back_the_exact_prior_state(writer, history, pick, whole):
    ns = f"prop{next(_counter)}.t"
    role_grant(namespace=NamespaceFactory(name=ns), principal=writer, role="writer")
    points = [cs for step in history if (cs := _apply_step(writer, ns, step)) is not None]
    if not points:
        return
    point = points[pick % len(points)]
    before = _state(ns)
    then = {
        e.key.slug: canonical(e.content)
        for e in entities_as_of(seq=point.seq, namespaces=None, namespace=ns, limit=100)
    }
    # The baseline statement is a shortcut: it must find exactly what the long way finds.
    fast = restore_service.scope_changes(store=baseline, seq=point.seq, namespace=ns)
    slow = restore_service.scope_changes_in_memory(store=baseline, seq=point.seq, namespace=ns)
    assert fast.total == slow.total
    assert [(c.key, canonical(c.target), c.version_now) for c in fast.changes] == [
        (c.key, canonical(c.target), c.version_now) for c in slow.changes
    ]
    if whole:
        restored = scope_restore(store=baseline, actor=writer, namespace=ns, as_of=point).changeset
        expected = then
    else:
        slug = SLUGS[pick % len(SLUGS)]
        if not Revision.objects.filter(namespace=ns, slug=slug).exists():
            return
        done = entity_restore(
            store=baseline, actor=writer, key=EntityKey(ns, "t", slug), as_of=point
        )
        restored = done.applied.changeset
        expected = dict(before)
        if slug in then:
            expected[slug] = then[slug]
        else:
            expected.pop(slug, None)
    assert _state(ns) == expected
    assert entity_table([ns]) == {k: v for k, v in replayed_table().items() if k.namespace == ns}
    if restored is None:
        assert expected == before
        return
    changeset_revert(store=baseline, actor=writer, changeset=restored)
    assert _state(ns) == before
