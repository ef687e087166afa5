"""Revert: the inverse of a changeset, written forward as one new changeset.

API.md "Changesets" (revert) and "Decisions that close open points": "moved
on" compares content; an entity already back at its pre-image is skipped;
revert ops have the shape of batch ops; nothing is written unless every op
applies. Service tests call ``changeset_revert``; API tests go through real
HTTP with token auth.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from atlas.exceptions import NotFound
from changesets.exceptions import RevertConflict
from changesets.models import Changeset, JournalEntry, Op, Revision, Rpc
from changesets.ops import DeleteOp, PatchOp, PutOp, canonical
from changesets.services.apply import changeset_apply
from changesets.services.revert import changeset_revert
from entities.store import baseline
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
from tests.entities.factories import NamespaceFactory

API = "/api/v1"
NS = "acme.orders"
NS2 = "acme.billing"
A = f"{NS}/order/a"
B = f"{NS}/order/b"
C = f"{NS}/order/c"
D = f"{NS}/order/d"
E = f"{NS}/order/e"
OP_REPR_KEYS = {"op", "namespace", "kind", "slug"}


# --- helpers -------------------------------------------------------------------------


def batch(actor: Any, *ops: tuple, rpc: str = Rpc.BATCH_MUTATE) -> Changeset:
    """One changeset from ``("put"|"patch", path, body)`` and ``("delete", path)`` specs."""
    built = []
    for i, spec in enumerate(ops):
        name, path = spec[0], key(spec[1])
        pointer = f"/ops/{i}"
        if name == "put":
            built.append(PutOp(path, spec[2], pointer=pointer))
        elif name == "patch":
            built.append(PatchOp(path, spec[2], pointer=pointer))
        else:
            built.append(DeleteOp(path, pointer=pointer))
    result = changeset_apply(store=baseline, actor=actor, ops=built, rpc=rpc)
    assert result.changeset is not None, "the setup batch moved nothing"
    return result.changeset


def content(path: str) -> dict[str, Any] | None:
    entity = baseline.get(key(path))
    return entity.content if entity is not None else None


def version(path: str) -> int | None:
    entity = baseline.get(key(path))
    return entity.version if entity is not None else None


def state(*paths: str) -> dict[str, str | None]:
    """Each path's content (canonical JSON) or None when absent."""
    return {p: (canonical(content(p)) if content(p) is not None else None) for p in paths}


def revert_url(changeset: Changeset | str) -> str:
    cs_id = changeset.id if isinstance(changeset, Changeset) else changeset
    return f"{API}/changesets/{cs_id}/revert"


def put_op(path: str, body: dict[str, Any]) -> dict[str, Any]:
    ns, kind, slug = path.split("/")
    return {"op": "put", "namespace": ns, "kind": kind, "slug": slug, "content": body}


def delete_op(path: str) -> dict[str, Any]:
    ns, kind, slug = path.split("/")
    return {"op": "delete", "namespace": ns, "kind": kind, "slug": slug}


def assert_ops(actual: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """Revert ops in batch-op shape, exact keys, content compared as JSON."""
    assert [canonical(o) for o in actual] == [canonical(o) for o in expected], actual
    for item in actual:
        assert set(item) == (OP_REPR_KEYS | {"content"} if item["op"] == "put" else OP_REPR_KEYS)


def by_slug(conflicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(conflicts, key=lambda c: (c["namespace"], c["kind"], c["slug"]))


def moved_on(path: str, newer: Changeset) -> dict[str, Any]:
    ns, kind, slug = path.split("/")
    return {
        "namespace": ns,
        "kind": kind,
        "slug": slug,
        "reason": "moved_on",
        "newer_changeset_id": str(newer.id),
    }


@pytest.fixture
def ns2(db):
    return NamespaceFactory(name=NS2)


@pytest.fixture
def api(client_for, writer):
    return client_for(writer)


# --- service: the four shapes of undo --------------------------------------------------


def test_revert_create_deletes_the_entity(staff, namespace, write):
    created = write(staff, A, {"n": 1}).changeset

    result = changeset_revert(store=baseline, actor=staff, changeset_id=str(created.id))

    assert content(A) is None
    assert_ops(result.ops, [delete_op(A)])
    assert result.dry_run is False
    cs = result.changeset
    assert cs.rpc == Rpc.REVERT_CHANGESET
    assert cs.message == "RevertChangeset: 1 change(s)"
    assert cs.author_name == staff.username
    assert_revision(
        only_revision(cs),
        op=Op.DELETE,
        key=key(A),
        before={"n": 1},
        after=None,
        before_version=1,
        after_version=None,
    )


def test_revert_update_puts_the_before_back_as_a_new_version(staff, namespace, write):
    write(staff, A, {"n": 1, "keep": [1, 2]})
    updated = write(staff, A, {"n": 2}).changeset

    result = changeset_revert(store=baseline, actor=staff, changeset_id=str(updated.id))

    assert_json_identical(content(A), {"n": 1, "keep": [1, 2]})
    assert version(A) == 3, "a revert is a forward write: versions never go back"
    assert_ops(result.ops, [put_op(A, {"n": 1, "keep": [1, 2]})])
    assert_revision(
        only_revision(result.changeset),
        op=Op.UPDATE,
        before={"n": 2},
        after={"n": 1, "keep": [1, 2]},
        before_version=2,
        after_version=3,
    )


def test_revert_delete_recreates_the_entity_with_its_before(staff, namespace, write):
    write(staff, A, {"n": 1})
    write(staff, A, {"n": 2})
    deleted = write(staff, A, None).changeset

    result = changeset_revert(store=baseline, actor=staff, changeset_id=str(deleted.id))

    assert_json_identical(content(A), {"n": 2})
    assert version(A) == 3, "a re-created key continues after its last version"
    assert_ops(result.ops, [put_op(A, {"n": 2})])
    assert_revision(
        only_revision(result.changeset),
        op=Op.CREATE,
        before=None,
        after={"n": 2},
        before_version=None,
        after_version=3,
    )


def test_revert_of_a_patch_restores_the_whole_before_image(staff, namespace, write):
    write(staff, A, {"n": 1, "gone": "soon", "nested": {"x": 1}})
    patched = write(staff, A, {"gone": None, "nested": {"y": 2}}, patch=True).changeset
    assert_json_identical(content(A), {"n": 1, "nested": {"x": 1, "y": 2}})

    changeset_revert(store=baseline, actor=staff, changeset_id=str(patched.id))

    assert_json_identical(content(A), {"n": 1, "gone": "soon", "nested": {"x": 1}})


def test_revert_mixed_batch_unwinds_newest_first_as_one_changeset(staff, namespace, write):
    write(staff, B, {"b": 1})
    write(staff, C, {"c": 1})
    write(staff, D, {"d": 1})
    mixed = batch(
        staff,
        ("put", A, {"a": 1}),  # create
        ("put", B, {"b": 2}),  # update
        ("delete", C),  # delete
        ("patch", D, {"d": 2, "extra": True}),  # update by patch
    )
    journal_before = JournalEntry.objects.count()

    result = changeset_revert(
        store=baseline, actor=staff, changeset_id=str(mixed.id), comment="undo the batch"
    )

    assert_ops(
        result.ops,
        [put_op(D, {"d": 1}), put_op(C, {"c": 1}), put_op(B, {"b": 1}), delete_op(A)],
    )
    assert state(A, B, C, D) == {
        A: None,
        B: canonical({"b": 1}),
        C: canonical({"c": 1}),
        D: canonical({"d": 1}),
    }
    cs = result.changeset
    assert Changeset.objects.filter(rpc=Rpc.REVERT_CHANGESET).count() == 1
    assert cs.rpc == Rpc.REVERT_CHANGESET
    assert cs.message == "RevertChangeset: 4 change(s)"
    assert cs.comment == "undo the batch"
    assert cs.op_count == 4
    assert cs.seq > mixed.seq
    revisions = list(cs.revisions.order_by("id"))
    assert [(r.slug, r.op) for r in revisions] == [
        ("d", Op.UPDATE),
        ("c", Op.CREATE),
        ("b", Op.UPDATE),
        ("a", Op.DELETE),
    ]
    assert JournalEntry.objects.count() == journal_before + 1
    # The history stays an unbroken chain that replays to the live table.
    assert replayed_table() == entity_table(), "revert must record revisions like any write"


def test_revert_unknown_changeset_raises_not_found(staff, namespace):
    with pytest.raises(NotFound):
        changeset_revert(store=baseline, actor=staff, changeset_id=str(uuid.uuid4()))


def test_service_refuses_a_changeset_touching_an_unreadable_namespace_as_not_found(
    staff, make_user, namespace, ns2, write
):
    """Not found, like a missing changeset: a 403 would confirm the hidden ops."""
    both = batch(staff, ("put", A, {"a": 1}), ("put", f"{NS2}/invoice/i", {"i": 1}))
    user = make_user("olga", writer=[NS])
    snapshot = log_snapshot()
    with pytest.raises(NotFound) as refused:
        changeset_revert(store=baseline, actor=user, changeset_id=str(both.id))
    missing = str(uuid.uuid4())
    with pytest.raises(NotFound) as absent:
        changeset_revert(store=baseline, actor=user, changeset_id=missing)
    assert refused.value.detail == absent.value.detail
    assert_nothing_written(snapshot)


# --- service: conflicts and skips ---------------------------------------------------------


def test_conflict_lists_every_moved_entity_and_writes_nothing(staff, namespace, write):
    for path in (A, B, E):
        write(staff, path, {"v": 1})
    target = batch(staff, ("put", A, {"v": 2}), ("put", B, {"v": 2}), ("put", E, {"v": 2}))
    moved_a = write(staff, A, {"v": 3}).changeset
    moved_b = write(staff, B, None).changeset  # a delete also moves an entity on
    snapshot = log_snapshot()

    with pytest.raises(RevertConflict) as info:
        changeset_revert(store=baseline, actor=staff, changeset_id=str(target.id))

    assert by_slug(info.value.conflicts) == [moved_on(A, moved_a), moved_on(B, moved_b)]
    assert_nothing_written(snapshot)
    assert_json_identical(content(E), {"v": 2}, what="E must not be reverted alone")


def test_newer_changeset_id_names_the_latest_mover(staff, namespace, write):
    write(staff, A, {"v": 1})
    target = write(staff, A, {"v": 2}).changeset
    write(staff, A, {"v": 3})
    write(staff, A, None)
    latest = write(staff, A, {"v": 4}).changeset

    with pytest.raises(RevertConflict) as info:
        changeset_revert(store=baseline, actor=staff, changeset_id=str(target.id))
    assert info.value.conflicts == [moved_on(A, latest)]


def test_deleted_then_recreated_with_other_content_is_a_conflict(staff, namespace, write):
    write(staff, A, {"v": 1})
    deleted = write(staff, A, None).changeset
    recreated = write(staff, A, {"v": "new"}).changeset
    snapshot = log_snapshot()

    with pytest.raises(RevertConflict) as info:
        changeset_revert(store=baseline, actor=staff, changeset_id=str(deleted.id))
    assert info.value.conflicts == [moved_on(A, recreated)]
    assert_nothing_written(snapshot)


def test_moved_on_compares_content_not_versions(staff, namespace, write):
    """Moved away and back to exactly what the changeset left: not moved on."""
    write(staff, A, {"v": 1})
    target = write(staff, A, {"v": 2}).changeset
    write(staff, A, {"v": 3})
    write(staff, A, {"v": 2})  # same content as the changeset's after, version 4

    result = changeset_revert(store=baseline, actor=staff, changeset_id=str(target.id))
    assert_json_identical(content(A), {"v": 1})
    assert_revision(only_revision(result.changeset), before_version=4, after_version=5)


def test_entity_already_at_its_pre_image_is_skipped_others_reverted(staff, namespace, write):
    write(staff, A, {"v": 1})
    write(staff, B, {"v": 1})
    target = batch(staff, ("put", A, {"v": 2}), ("put", B, {"v": 2}), ("put", C, {"v": 2}))
    write(staff, A, {"v": 1})  # put back by hand
    write(staff, C, None)  # created by target, since deleted: also back at its pre-image

    result = changeset_revert(store=baseline, actor=staff, changeset_id=str(target.id))

    assert_ops(result.ops, [put_op(B, {"v": 1})])
    assert result.changeset.message == "RevertChangeset: 1 change(s)"
    assert_revision(only_revision(result.changeset), key=key(B), after={"v": 1})
    assert state(A, B, C) == {A: canonical({"v": 1}), B: canonical({"v": 1}), C: None}


def test_everything_already_at_pre_image_writes_nothing(staff, namespace, write):
    write(staff, A, {"v": 1})
    target = batch(staff, ("put", A, {"v": 2}), ("put", B, {"v": 2}))
    write(staff, A, {"v": 1})
    write(staff, B, None)
    snapshot = log_snapshot()

    result = changeset_revert(store=baseline, actor=staff, changeset_id=str(target.id))

    assert result.changeset is None
    assert result.ops == []
    assert_nothing_written(snapshot)


def test_skip_and_conflict_together_still_refuses(staff, namespace, write):
    write(staff, A, {"v": 1})
    write(staff, B, {"v": 1})
    target = batch(staff, ("put", A, {"v": 2}), ("put", B, {"v": 2}))
    write(staff, A, {"v": 1})  # at its pre-image: skipped
    mover = write(staff, B, {"v": 9}).changeset  # moved on: conflict
    snapshot = log_snapshot()

    with pytest.raises(RevertConflict) as info:
        changeset_revert(store=baseline, actor=staff, changeset_id=str(target.id))
    assert info.value.conflicts == [moved_on(B, mover)]
    assert_nothing_written(snapshot)


def test_dry_run_reports_ops_and_writes_nothing(staff, namespace, write):
    write(staff, B, {"b": 1})
    target = batch(staff, ("put", A, {"a": 1}), ("put", B, {"b": 2}))
    snapshot = log_snapshot()

    result = changeset_revert(
        store=baseline, actor=staff, changeset_id=str(target.id), dry_run=True
    )

    assert result.changeset is None
    assert result.dry_run is True
    assert_ops(result.ops, [put_op(B, {"b": 1}), delete_op(A)])
    assert_nothing_written(snapshot)


# --- revert of revert ----------------------------------------------------------------------


def test_revert_of_revert_restores_the_original_state(staff, namespace, write):
    write(staff, B, {"b": 1})
    write(staff, C, {"c": 1})
    original = batch(
        staff, ("put", A, {"a": 1}), ("put", B, {"b": 2}), ("delete", C), ("put", D, {"d": 1})
    )
    after_original = state(A, B, C, D)
    before_original = {A: None, B: canonical({"b": 1}), C: canonical({"c": 1}), D: None}

    undo = changeset_revert(store=baseline, actor=staff, changeset_id=str(original.id))
    assert state(A, B, C, D) == before_original

    redo = changeset_revert(store=baseline, actor=staff, changeset_id=str(undo.changeset.id))
    assert state(A, B, C, D) == after_original
    assert redo.changeset.rpc == Rpc.REVERT_CHANGESET
    assert redo.changeset.op_count == 4

    # And once more: the chain is reversible all the way down.
    changeset_revert(store=baseline, actor=staff, changeset_id=str(redo.changeset.id))
    assert state(A, B, C, D) == before_original
    assert replayed_table() == entity_table()


def test_revert_of_revert_changes_existence_not_just_content(staff, namespace, write):
    created = write(staff, A, {"a": 1}).changeset
    undo = changeset_revert(store=baseline, actor=staff, changeset_id=str(created.id))
    assert content(A) is None
    changeset_revert(store=baseline, actor=staff, changeset_id=str(undo.changeset.id))
    assert_json_identical(content(A), {"a": 1})
    assert version(A) == 2


def test_reverting_the_same_changeset_twice_is_a_no_op_the_second_time(staff, namespace, write):
    write(staff, A, {"v": 1})
    target = write(staff, A, {"v": 2}).changeset
    changeset_revert(store=baseline, actor=staff, changeset_id=str(target.id))
    snapshot = log_snapshot()
    again = changeset_revert(store=baseline, actor=staff, changeset_id=str(target.id))
    assert again.changeset is None
    assert_nothing_written(snapshot)


# --- HTTP ---------------------------------------------------------------------------------


def test_http_revert_answers_the_new_changeset_and_ops(api, writer, staff, namespace, write):
    write(staff, B, {"b": 1})
    target = batch(staff, ("put", A, {"a": 1}), ("put", B, {"b": 2}), ("delete", B))
    response = api.post(revert_url(target), {"comment": "oops"}, format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"changeset", "ops", "dry_run"}
    assert body["dry_run"] is False
    assert_ops(body["ops"], [put_op(B, {"b": 1}), delete_op(A)])
    cs = body["changeset"]
    assert cs["rpc"] == "RevertChangeset"
    assert cs["author"] == writer.username
    assert cs["message"] == "RevertChangeset: 2 change(s)"
    assert cs["comment"] == "oops"
    assert cs["branch"] == ""
    assert cs["op_count"] == 2
    assert {(o["slug"], o["op"]) for o in cs["ops"]} == {("a", "delete"), ("b", "create")}
    fetched = api.get(f"{API}/changesets/{cs['id']}")
    assert fetched.status_code == 200
    assert fetched.json()["rpc"] == "RevertChangeset"
    assert state(A, B) == {A: None, B: canonical({"b": 1})}


def test_http_revert_without_a_body(api, staff, namespace, write):
    created = write(staff, A, {"a": 1}).changeset
    response = api.post(revert_url(created))
    assert response.status_code == 200, response.content
    assert response.json()["changeset"]["rpc"] == "RevertChangeset"
    assert content(A) is None


def test_http_conflict_is_409_problem_with_conflicts_and_nothing_written(
    api, staff, namespace, write
):
    write(staff, A, {"v": 1})
    write(staff, B, {"v": 1})
    target = batch(staff, ("put", A, {"v": 2}), ("put", B, {"v": 2}), ("put", C, {"v": 2}))
    mover_a = write(staff, A, {"v": 3}).changeset
    mover_b = write(staff, B, None).changeset
    snapshot = log_snapshot()

    response = api.post(revert_url(target), {}, format="json")

    body = assert_problem(response, 409)
    assert body["type"].endswith("/revert-conflict")
    assert by_slug(body["conflicts"]) == [moved_on(A, mover_a), moved_on(B, mover_b)]
    for conflict in body["conflicts"]:
        assert set(conflict) == {"namespace", "kind", "slug", "reason", "newer_changeset_id"}
    assert_nothing_written(snapshot)
    assert not Changeset.objects.filter(rpc=Rpc.REVERT_CHANGESET).exists()


def test_http_dry_run_conflict_is_still_409(api, staff, namespace, write):
    write(staff, A, {"v": 1})
    target = write(staff, A, {"v": 2}).changeset
    mover = write(staff, A, {"v": 3}).changeset
    snapshot = log_snapshot()
    body = assert_problem(api.post(revert_url(target), {"dry_run": True}, format="json"), 409)
    assert body["conflicts"] == [moved_on(A, mover)]
    assert_nothing_written(snapshot)


def test_http_dry_run_writes_nothing_and_reports_ops(api, staff, namespace, write):
    write(staff, B, {"b": 1})
    write(staff, C, {"c": 1})
    target = batch(staff, ("put", A, {"a": [1, {"x": None}]}), ("put", B, {"b": 2}), ("delete", C))
    snapshot = log_snapshot()

    response = api.post(revert_url(target), {"dry_run": True}, format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["changeset"] is None
    assert body["dry_run"] is True
    assert_ops(body["ops"], [put_op(C, {"c": 1}), put_op(B, {"b": 1}), delete_op(A)])
    assert_nothing_written(snapshot)


def test_http_everything_at_pre_image_is_200_with_changeset_null(api, staff, namespace, write):
    created = write(staff, A, {"a": 1}).changeset
    write(staff, A, None)
    snapshot = log_snapshot()
    response = api.post(revert_url(created), {}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"changeset": None, "ops": [], "dry_run": False}
    assert_nothing_written(snapshot)


def test_http_revert_of_revert(api, staff, namespace, write):
    write(staff, B, {"b": 1})
    original = batch(staff, ("put", A, {"a": 1}), ("delete", B))
    after_original = state(A, B)
    undo = api.post(revert_url(original), {}, format="json").json()["changeset"]
    assert state(A, B) == {A: None, B: canonical({"b": 1})}
    redo = api.post(revert_url(undo["id"]), {}, format="json")
    assert redo.status_code == 200, redo.content
    assert state(A, B) == after_original


# --- HTTP: permissions ------------------------------------------------------------------------


def test_reader_gets_403_and_nothing_written(make_user, client_for, staff, namespace, write):
    target = write(staff, A, {"a": 1}).changeset
    reader = make_user("rita", reader=[NS])
    snapshot = log_snapshot()
    assert_problem(client_for(reader).post(revert_url(target), {}, format="json"), 403)
    assert_nothing_written(snapshot)


def test_reader_dry_run_is_also_403(make_user, client_for, staff, namespace, write):
    target = write(staff, A, {"a": 1}).changeset
    reader = make_user("rita", reader=[NS])
    assert_problem(
        client_for(reader).post(revert_url(target), {"dry_run": True}, format="json"), 403
    )


def test_no_role_on_the_namespace_is_404(make_user, client_for, staff, namespace, ns2, write):
    target = write(staff, A, {"a": 1}).changeset
    stranger = make_user("sam", writer=[NS2])
    snapshot = log_snapshot()
    assert_problem(client_for(stranger).post(revert_url(target), {}, format="json"), 404)
    assert_nothing_written(snapshot)


def test_protected_baseline_needs_maintainer(
    make_user, client_for, staff, protected_namespace, write
):
    path = f"{protected_namespace.name}/rule/r1"
    write(staff, path, {"v": 1})
    target = write(staff, path, {"v": 2}).changeset
    plain_writer = make_user("will", writer=[protected_namespace.name])
    maintainer = make_user("mary", maintainer=[protected_namespace.name])
    snapshot = log_snapshot()

    assert_problem(client_for(plain_writer).post(revert_url(target), {}, format="json"), 403)
    assert_nothing_written(snapshot)

    response = client_for(maintainer).post(revert_url(target), {}, format="json")
    assert response.status_code == 200, response.content
    assert_json_identical(content(path), {"v": 1})


def test_changeset_touching_an_unreadable_namespace_is_404_nothing_written(
    api, staff, namespace, ns2, write
):
    """API.md "Limits and visibility": 404 as if it were not there, dry run too;
    the body is the one a missing changeset gets."""
    both = batch(staff, ("put", A, {"a": 1}), ("put", f"{NS2}/invoice/i", {"i": 1}))
    snapshot = log_snapshot()
    hidden = assert_problem(api.post(revert_url(both), {}, format="json"), 404)
    assert_nothing_written(snapshot)
    assert_problem(api.post(revert_url(both), {"dry_run": True}, format="json"), 404)
    missing = assert_problem(api.post(revert_url(str(uuid.uuid4())), {}, format="json"), 404)
    assert {k: v for k, v in hidden.items() if k != "instance"} == {
        k: v for k, v in missing.items() if k != "instance"
    }


def test_writer_on_one_reader_on_other_namespace_is_403(
    make_user, client_for, staff, namespace, ns2, write
):
    both = batch(staff, ("put", A, {"a": 1}), ("put", f"{NS2}/invoice/i", {"i": 1}))
    user = make_user("half", writer=[NS], reader=[NS2])
    snapshot = log_snapshot()
    assert_problem(client_for(user).post(revert_url(both), {}, format="json"), 403)
    assert_nothing_written(snapshot)


def test_anonymous_is_401(client_for, staff, namespace, write):
    target = write(staff, A, {"a": 1}).changeset
    assert client_for(None).post(revert_url(target), {}, format="json").status_code == 401


# --- HTTP: bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changeset_id", ["5d0a8b4e-3f1c-4b7a-9e26-8c1d2f0a7b13", "not-a-uuid", "123"]
)
def test_unknown_or_malformed_id_is_404(api, namespace, changeset_id):
    assert_problem(api.post(revert_url(changeset_id), {}, format="json"), 404)


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"dry_run": True, "force": True}, "/force"),
        ({"dry_run": "yes"}, "/dry_run"),
        ({"comment": 7}, "/comment"),
    ],
)
def test_invalid_body_is_422_and_writes_nothing(api, staff, namespace, write, body, pointer):
    target = write(staff, A, {"a": 1}).changeset
    snapshot = log_snapshot()
    assert_problem(api.post(revert_url(target), body, format="json"), 422, error_pointers=[pointer])
    assert_nothing_written(snapshot)


def test_non_object_body_is_422(api, staff, namespace, write):
    target = write(staff, A, {"a": 1}).changeset
    assert_problem(api.post(revert_url(target), [1], format="json"), 422)


def test_malformed_json_body_is_400(api, staff, namespace, write):
    target = write(staff, A, {"a": 1}).changeset
    response = api.post(revert_url(target), data="{", content_type="application/json")
    assert_problem(response, 400)


# --- HTTP: idempotency ------------------------------------------------------------------------


def test_idempotency_key_replays_the_revert(api, staff, namespace, write):
    write(staff, A, {"v": 1})
    target = write(staff, A, {"v": 2}).changeset

    first = api.post(revert_url(target), {}, format="json", HTTP_IDEMPOTENCY_KEY="undo-1")
    assert first.status_code == 200, first.content
    assert "Idempotent-Replayed" not in first
    snapshot = log_snapshot()

    second = api.post(revert_url(target), {}, format="json", HTTP_IDEMPOTENCY_KEY="undo-1")
    assert second.status_code == 200
    assert second["Idempotent-Replayed"] == "true"
    assert second.content == first.content
    assert second.json()["changeset"]["id"] == first.json()["changeset"]["id"]
    assert_nothing_written(snapshot)
    assert Changeset.objects.filter(rpc=Rpc.REVERT_CHANGESET).count() == 1

    # Without the key, a second revert finds everything at its pre-image.
    third = api.post(revert_url(target), {}, format="json")
    assert third.json()["changeset"] is None


def test_idempotency_key_replays_a_conflict(api, staff, namespace, write):
    write(staff, A, {"v": 1})
    target = write(staff, A, {"v": 2}).changeset
    write(staff, A, {"v": 3})
    first = api.post(revert_url(target), {}, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert_problem(first, 409)
    second = api.post(revert_url(target), {}, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert second.status_code == 409
    assert second["Idempotent-Replayed"] == "true"
    assert second.content == first.content


def test_idempotency_key_reused_for_another_changeset_is_422(api, staff, namespace, write):
    one = write(staff, A, {"a": 1}).changeset
    two = write(staff, B, {"b": 1}).changeset
    assert api.post(revert_url(one), {}, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 200
    assert_problem(api.post(revert_url(two), {}, format="json", HTTP_IDEMPOTENCY_KEY="k"), 422)
    assert content(B) is not None


# --- the revert is an ordinary write in the log ------------------------------------------------


def test_revert_shows_in_entity_history_as_a_forward_revision(api, staff, namespace, write):
    write(staff, A, {"v": 1})
    target = write(staff, A, {"v": 2}).changeset
    undo = api.post(revert_url(target), {}, format="json").json()["changeset"]
    history = api.get(f"{API}/entities/{A}/history").json()["results"]
    assert [h["changeset_id"] for h in history][0] == undo["id"]
    assert history[0]["rpc"] == "RevertChangeset"
    assert history[0]["before"] == {"v": 2}
    assert history[0]["after"] == {"v": 1}
    assert [h["after_version"] for h in history] == [3, 2, 1]
    assert Revision.objects.filter(changeset_id=undo["id"]).count() == 1
