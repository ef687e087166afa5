"""Key-level and partial revert (API.md "Restore and key-level merge (added)").

``granularity: "key"`` undoes only the pointers a changeset changed, through the
one three-way merge (base = its ``after``, ours = now, theirs = its ``before``);
``only`` limits a revert to some of its entities. Both are decided under the
write service's locks: the last tests race real transactions against them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection

from changesets.exceptions import RevertConflict
from changesets.models import Changeset, Revision, Rpc
from changesets.ops import PatchOp
from changesets.services import apply as apply_module
from changesets.services.apply import changeset_apply
from changesets.services.revert import changeset_revert
from entities.store import baseline
from tests.atlas.test_errors import assert_problem
from tests.changesets.helpers import (
    assert_json_identical,
    assert_nothing_written,
    assert_revision,
    key,
    log_snapshot,
    only_revision,
)
from tests.changesets.test_concurrency import THREAD_TIMEOUT, assert_no_errors, run_in_threads
from tests.changesets.test_revert import batch, content, delete_op, put_op, revert_url

API = "/api/v1"
NS = "acme.orders"
A = f"{NS}/order/a"
B = f"{NS}/order/b"
BRANCH_HEADER = "HTTP_X_ATLAS_BRANCH"


@pytest.fixture
def api(client_for, writer):
    return client_for(writer)


def patch(actor: Any, path: str, body: dict[str, Any]) -> Changeset:
    result = changeset_apply(
        store=baseline, actor=actor, ops=[PatchOp(key(path), body)], rpc=Rpc.PATCH_ENTITY
    )
    assert result.changeset is not None
    return result.changeset


def revert(api: Any, changeset: Changeset, **body: Any) -> Any:
    return api.post(revert_url(changeset), body, format="json")


def conflict(path: str, pointer: str, base: Any, ours: Any, theirs: Any) -> dict[str, Any]:
    ns, kind, slug = path.split("/")
    return {
        "namespace": ns,
        "kind": kind,
        "slug": slug,
        "pointer": pointer,
        "reason": "key_moved_on",
        "base": base,
        "ours": ours,
        "theirs": theirs,
    }


# --- the rule --------------------------------------------------------------------------


def test_key_level_revert_of_an_old_change_survives_unrelated_later_edits(api, writer, write):
    write(writer, A, {"title": "Order", "n": 1, "meta": {"owner": "ann", "tier": 1}})
    old = patch(writer, A, {"title": "Order placed", "meta": {"tier": 2}})
    patch(writer, A, {"n": 2, "meta": {"owner": "bob"}})  # other pointers, later

    dry = revert(api, old, granularity="key", dry_run=True)
    assert dry.status_code == 200, dry.content
    expected = {"title": "Order", "n": 2, "meta": {"owner": "bob", "tier": 1}}
    assert dry.json()["changeset"] is None and dry.json()["dry_run"] is True
    assert dry.json()["ops"] == [put_op(A, expected)]  # the exact ops the real run writes

    response = revert(api, old, granularity="key", comment="undo the rename")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["ops"] == dry.json()["ops"]
    assert body["changeset"]["rpc"] == "RevertChangeset"
    assert body["changeset"]["comment"] == "undo the rename"
    assert_json_identical(content(A), expected)
    written = Changeset.objects.get(pk=body["changeset"]["id"])
    assert_revision(only_revision(written), op="update", after=expected)


def test_entity_granularity_still_refuses_the_same_revert_as_moved_on(api, writer, write):
    write(writer, A, {"title": "Order", "n": 1})
    old = patch(writer, A, {"title": "Order placed"})
    patch(writer, A, {"n": 2})
    response = revert(api, old)  # granularity defaults to entity
    problem = assert_problem(response, 409)
    assert [c["reason"] for c in problem["conflicts"]] == ["moved_on"]


def test_a_later_edit_to_the_same_key_is_a_conflict_naming_the_pointer(api, writer, write):
    write(writer, A, {"title": "Order", "meta": {"tier": 1, "owner": "ann"}})
    old = patch(writer, A, {"title": "Order placed", "meta": {"tier": 2}})
    patch(writer, A, {"title": "Order was placed", "meta": {"owner": "bob"}})

    before = log_snapshot()
    problem = assert_problem(revert(api, old, granularity="key"), 409)
    assert problem["conflicts"] == [
        conflict(A, "/title", "Order placed", "Order was placed", "Order")
    ]
    assert problem["type"].endswith("revert-conflict")
    assert_nothing_written(before)
    assert content(A)["title"] == "Order was placed"


def test_every_conflict_of_every_entity_is_listed_and_nothing_is_written(writer, write):
    write(writer, A, {"x": 1, "y": 1})
    write(writer, B, {"x": 1})
    old = batch(writer, ("put", A, {"x": 2, "y": 2}), ("put", B, {"x": 2}))
    batch(writer, ("put", A, {"x": 3, "y": 3}), ("put", B, {"x": 3}))
    before = log_snapshot()
    with pytest.raises(RevertConflict) as caught:
        changeset_revert(store=baseline, actor=writer, changeset=old, granularity="key")
    assert sorted((c["slug"], c["pointer"]) for c in caught.value.conflicts) == [
        ("a", "/x"),
        ("a", "/y"),
        ("b", "/x"),
    ]
    assert_nothing_written(before)


def test_a_pointer_already_back_at_its_pre_image_is_skipped(writer, write):
    write(writer, A, {"title": "Order", "n": 1})
    old = patch(writer, A, {"title": "Order placed", "n": 2})
    patch(writer, A, {"title": "Order"})  # someone undid the title by hand
    result = changeset_revert(store=baseline, actor=writer, changeset=old, granularity="key")
    assert_json_identical(content(A), {"title": "Order", "n": 1})
    assert result.ops == [put_op(A, {"title": "Order", "n": 1})]


def test_when_nothing_is_left_to_change_the_changeset_is_null(api, writer, write):
    write(writer, A, {"title": "Order"})
    old = patch(writer, A, {"title": "Order placed"})
    patch(writer, A, {"title": "Order"})
    before = log_snapshot()
    response = revert(api, old, granularity="key")
    assert response.status_code == 200, response.content
    assert response.json() == {"changeset": None, "ops": [], "dry_run": False}
    assert_nothing_written(before)


def test_undoing_a_create_deletes_only_while_the_entity_still_equals_what_it_created(
    api, writer, write
):
    created = write(writer, A, {"n": 1}).changeset
    patch(writer, A, {"m": 1})
    problem = assert_problem(revert(api, created, granularity="key"), 409)
    assert problem["conflicts"] == [conflict(A, "", {"n": 1}, {"n": 1, "m": 1}, None)]

    created_b = write(writer, B, {"n": 1}).changeset
    response = revert(api, created_b, granularity="key")
    assert response.status_code == 200, response.content
    assert response.json()["ops"] == [delete_op(B)]
    assert content(B) is None


def test_undoing_a_delete_re_creates_the_entity(api, writer, write):
    write(writer, A, {"n": 1})
    deleted = write(writer, A, None).changeset
    response = revert(api, deleted, granularity="key")
    assert response.status_code == 200, response.content
    assert response.json()["ops"] == [put_op(A, {"n": 1})]
    assert_json_identical(content(A), {"n": 1})


def test_a_key_level_revert_can_itself_be_reverted_key_by_key(writer, write):
    write(writer, A, {"title": "Order", "n": 1})
    old = patch(writer, A, {"title": "Order placed"})
    patch(writer, A, {"n": 2})
    undo = changeset_revert(store=baseline, actor=writer, changeset=old, granularity="key")
    patch(writer, A, {"n": 3})
    changeset_revert(store=baseline, actor=writer, changeset=undo.changeset, granularity="key")
    assert_json_identical(content(A), {"title": "Order placed", "n": 3})


def test_under_a_branch_header_the_key_level_undo_is_staged_on_the_branch(
    api, writer, write, make_branch_for
):
    write(writer, A, {"title": "Order", "n": 1})
    old = patch(writer, A, {"title": "Order placed"})
    branch = make_branch_for(writer)
    api.patch(
        f"{API}/entities/{NS}/order/a",
        {"patch": {"n": 5}},
        format="json",
        **{BRANCH_HEADER: branch.name},
    )
    response = api.post(
        revert_url(old), {"granularity": "key"}, format="json", **{BRANCH_HEADER: branch.name}
    )
    assert response.status_code == 200, response.content
    assert response.json()["changeset"]["branch"] == branch.name
    assert response.json()["ops"] == [put_op(A, {"title": "Order", "n": 5})]
    assert_json_identical(content(A), {"title": "Order placed", "n": 1})  # baseline untouched


@pytest.fixture
def make_branch_for(db):
    from branches.services import branch_create

    return lambda actor: branch_create(name="staging", actor=actor)


# --- partial revert ----------------------------------------------------------------------


def ref(path: str) -> dict[str, str]:
    ns, kind, slug = path.split("/")
    return {"namespace": ns, "kind": kind, "slug": slug}


@pytest.mark.parametrize("granularity", ["entity", "key"])
def test_partial_revert_undoes_only_the_named_entities(api, writer, write, granularity):
    write(writer, A, {"n": 1})
    write(writer, B, {"n": 1})
    both = batch(writer, ("put", A, {"n": 2}), ("put", B, {"n": 2}))
    response = revert(api, both, only=[ref(B)], granularity=granularity)
    assert response.status_code == 200, response.content
    assert response.json()["ops"] == [put_op(B, {"n": 1})]
    assert (content(A), content(B)) == ({"n": 2}, {"n": 1})
    written = Changeset.objects.get(pk=response.json()["changeset"]["id"])
    assert [r.slug for r in Revision.objects.filter(changeset=written)] == ["b"]


def test_partial_revert_leaves_a_moved_on_entity_out_of_the_way(api, writer, write):
    write(writer, A, {"n": 1})
    write(writer, B, {"n": 1})
    both = batch(writer, ("put", A, {"n": 2}), ("put", B, {"n": 2}))
    patch(writer, A, {"n": 3})
    assert_problem(revert(api, both), 409)
    response = revert(api, both, only=[ref(B)])
    assert response.status_code == 200, response.content
    assert content(B) == {"n": 1}


def test_a_ref_the_changeset_did_not_touch_is_422_at_its_pointer(api, writer, write):
    write(writer, A, {"n": 1})
    changed = patch(writer, A, {"n": 2})
    before = log_snapshot()
    response = revert(api, changed, only=[ref(A), ref(B), ref(f"{NS}/other/a")])
    problem = assert_problem(
        response, 422, pointer="/only/1", error_pointers=["/only/1", "/only/2"]
    )
    assert "did not touch" in problem["detail"]
    assert_nothing_written(before)


@pytest.mark.parametrize(
    ("body", "pointers"),
    [
        ({"granularity": "pointer"}, ["/granularity"]),
        ({"granularity": None}, ["/granularity"]),
        ({"only": {"namespace": NS}}, ["/only"]),
        ({"only": ["a"]}, ["/only/0"]),
        ({"only": [{"namespace": NS, "kind": "order"}]}, ["/only/0/slug"]),
        ({"only": [{**ref(A), "extra": 1}]}, ["/only/0/extra"]),
        ({"only": [{**ref(A), "slug": "no spaces"}]}, ["/only/0/slug"]),
    ],
)
def test_bad_granularity_or_only_is_422_with_pointers(api, writer, write, body, pointers):
    write(writer, A, {"n": 1})
    changed = patch(writer, A, {"n": 2})
    problem = assert_problem(revert(api, changed, **body), 422)
    assert [e["pointer"] for e in problem["errors"]] == pointers


def test_the_schema_documents_granularity_and_only(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    body = schema["components"]["schemas"]["RevertBodyRequest"]["properties"]
    enum = body["granularity"]["allOf"][0]["$ref"].rsplit("/", 1)[1]
    assert schema["components"]["schemas"][enum]["enum"] == ["entity", "key"]
    assert body["only"]["type"] == "array"


# --- concurrency: real transactions --------------------------------------------------


def _wait_for_a_lock_waiter() -> None:
    """Return once some session waits on a row lock (the revert, behind the write)."""
    deadline = time.monotonic() + THREAD_TIMEOUT
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.05)
    raise AssertionError("the revert never waited for the racing write's lock")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("same_pointer", [False, True], ids=["other-pointer", "same-pointer"])
def test_a_key_level_revert_racing_a_write_never_overwrites_it(
    writer, write, monkeypatch, same_pointer, locked_writes
):
    """The write locks the entity first and holds its transaction open after writing;
    the revert, started meanwhile, waits on the row, then decides on the new state:
    it applies on top of the write, or reports the conflict. Never the stale state."""
    write(writer, A, {"title": "Order", "n": 1})
    old = patch(writer, A, {"title": "Order placed"})
    written, release = threading.Event(), threading.Event()
    real = apply_module._write_log

    def pausing(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        if threading.current_thread().name == "t0":
            written.set()
            assert release.wait(THREAD_TIMEOUT)
        return out

    monkeypatch.setattr(apply_module, "_write_log", pausing)
    racing = {"title": "Order shipped"} if same_pointer else {"n": 2}

    def racing_write() -> Any:
        return patch(writer, A, racing)

    def key_revert() -> Any:
        assert written.wait(THREAD_TIMEOUT)
        return changeset_revert(store=baseline, actor=writer, changeset=old, granularity="key")

    def releaser() -> None:
        assert written.wait(THREAD_TIMEOUT)
        try:
            _wait_for_a_lock_waiter()
        finally:
            release.set()

    outcomes = run_in_threads(racing_write, key_revert, releaser)
    write_outcome, revert_outcome, _ = outcomes
    assert not isinstance(write_outcome, BaseException), write_outcome
    if same_pointer:
        assert isinstance(revert_outcome, RevertConflict), revert_outcome
        assert [(c["pointer"], c["ours"]) for c in revert_outcome.conflicts] == [
            ("/title", "Order shipped")
        ]
        assert_json_identical(content(A), {"title": "Order shipped", "n": 1})
    else:
        assert_no_errors(outcomes)
        assert revert_outcome.changeset.seq > write_outcome.seq
        assert_json_identical(content(A), {"title": "Order", "n": 2})


@pytest.mark.django_db(transaction=True)
def test_free_running_races_keep_every_racing_write(writer, write):
    """No forced order: whichever locks first, the racing write's value survives, and
    the title is either reverted (the revert applied) or the revert saw a conflict."""
    for round_ in range(6):
        path = f"{NS}/order/r{round_}"
        write(writer, path, {"title": "Order", "n": 0})
        old = patch(writer, path, {"title": "Order placed"})
        same = round_ % 2 == 1
        racing = {"title": f"edit {round_}"} if same else {"n": round_ + 1}
        outcomes = run_in_threads(
            lambda p=path, r=racing: patch(writer, p, r),
            lambda o=old: changeset_revert(
                store=baseline, actor=writer, changeset=o, granularity="key"
            ),
        )
        assert not isinstance(outcomes[0], BaseException), outcomes[0]
        final = content(path)
        for name, value in racing.items():
            assert final[name] == value, (round_, final, outcomes)
        if isinstance(outcomes[1], RevertConflict):
            assert same, outcomes[1].conflicts
        else:
            assert not isinstance(outcomes[1], BaseException), outcomes[1]
            if not same:
                assert final["title"] == "Order"
