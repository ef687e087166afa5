"""No changeset, from any path, has more than ``ATLAS_MAX_BATCH_OPS`` ops.

API.md "Limits and visibility (added)": beyond the limit → 413 problem+json,
nothing written; a dry run answers 413 like the real request. The one check
lives in the write service (``changesets.services.apply.check_op_limit``), raising
``changesets.exceptions.TooManyOps``; these tests drive it through every path
built today (service, batch, delete-by-query, revert, import, merge).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings

from atlas.exceptions import PayloadTooLarge
from branches.models import Branch, BranchStatus
from changesets.exceptions import TooManyOps
from changesets.models import Changeset, Rpc
from changesets.ops import DeleteOp, PutOp
from changesets.services.apply import changeset_apply, changeset_apply_planned
from changesets.services.revert import changeset_revert
from entities.store import baseline
from tests.atlas.test_errors import assert_problem
from tests.changesets.helpers import assert_nothing_written, key, log_snapshot
from tests.entities.factories import UserFactory

API = "/api/v1"
NS = "acme.orders"
BRANCH_HEADER = "HTTP_X_ATLAS_BRANCH"


@pytest.fixture
def root(db):
    return UserFactory(username="root", is_superuser=True, is_staff=True)


@pytest.fixture
def api(client_for, root):
    return client_for(root)


def puts(n: int, *, prefix: str = "e") -> list[PutOp]:
    return [PutOp(key(f"{NS}/event/{prefix}{i}"), {"i": i}) for i in range(n)]


def assert_too_many(response: Any, count: int, limit: int, *, what: str = "") -> dict[str, Any]:
    body = assert_problem(response, 413)
    detail = f"{count} ops; the limit is {limit}"
    assert body["detail"] == (f"{what} would write {detail}." if what else detail)
    assert body["type"].endswith("/too-many-ops")
    assert (body["op_count"], body["limit"]) == (count, limit)
    return body


class _NoLocks:
    """A baseline whose ``lock`` must not run: the refusal comes first."""

    branch = ""

    def lock(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a row was locked before the op limit was checked")


# --- the service --------------------------------------------------------------------


def test_too_many_ops_is_a_named_413(db):
    error = TooManyOps(12, 10)
    assert isinstance(error, PayloadTooLarge)
    assert error.status == 413
    assert (error.count, error.limit, error.detail) == (12, 10, "12 ops; the limit is 10")


@override_settings(ATLAS_MAX_BATCH_OPS=3)
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_write_over_the_op_limit_is_refused_before_any_row_is_locked(root, namespace, dry_run):
    snapshot = log_snapshot()
    with pytest.raises(TooManyOps) as refused:
        changeset_apply(
            store=_NoLocks(), actor=root, ops=puts(4), rpc=Rpc.BATCH_MUTATE, dry_run=dry_run
        )
    assert refused.value.detail == "4 ops; the limit is 3"
    assert_nothing_written(snapshot)


@override_settings(ATLAS_MAX_BATCH_OPS=3)
def test_a_write_at_the_op_limit_lands(root, namespace):
    result = changeset_apply(store=baseline, actor=root, ops=puts(3), rpc=Rpc.BATCH_MUTATE)
    assert result.changeset is not None and result.changeset.op_count == 3


@override_settings(ATLAS_MAX_BATCH_OPS=3)
@pytest.mark.parametrize("dry_run", [False, True])
def test_ops_planned_inside_the_transaction_are_held_to_the_limit(root, namespace, dry_run):
    keys = [op.key for op in puts(4)]
    snapshot = log_snapshot()
    with pytest.raises(TooManyOps):
        changeset_apply_planned(
            store=baseline,
            actor=root,
            rpc=Rpc.IMPORT_CHANGESET,
            keys=keys,
            plan=lambda current: puts(4),
            dry_run=dry_run,
        )
    assert_nothing_written(snapshot)


@override_settings(ATLAS_MAX_BATCH_OPS=3)
def test_a_plan_within_the_limit_over_more_locked_keys_lands(root, namespace):
    """The plan's ops count, not the keys it may touch."""
    keys = [op.key for op in puts(5)]
    result = changeset_apply_planned(
        store=baseline,
        actor=root,
        rpc=Rpc.IMPORT_CHANGESET,
        keys=keys,
        plan=lambda current: puts(2),
    )
    assert result.changeset is not None and result.changeset.op_count == 2


def test_the_limit_counts_ops_even_when_they_fold_to_fewer_revisions(root, namespace):
    """Like the batch API: the request's ops are counted, so whether a request is
    refused never depends on the state it meets."""
    same = [PutOp(key(f"{NS}/event/e"), {"i": i}) for i in range(4)]
    with override_settings(ATLAS_MAX_BATCH_OPS=3), pytest.raises(TooManyOps):
        changeset_apply(store=baseline, actor=root, ops=same, rpc=Rpc.BATCH_MUTATE)


# --- every path over HTTP -------------------------------------------------------------


def test_a_batch_over_the_limit_is_413_dry_run_too(api, namespace):
    ops = [
        {"op": "put", "namespace": NS, "kind": "event", "slug": f"e{i}", "content": {}}
        for i in range(4)
    ]
    snapshot = log_snapshot()
    with override_settings(ATLAS_MAX_BATCH_OPS=3):
        for dry_run in (False, True):
            response = api.post(f"{API}/batch", {"ops": ops, "dry_run": dry_run}, format="json")
            assert_problem(response, 413, pointer="/ops")  # the API's own check, first
    assert_nothing_written(snapshot)


def test_delete_by_query_over_the_limit_is_413(api, root, namespace):
    changeset_apply(store=baseline, actor=root, ops=puts(4), rpc=Rpc.BATCH_MUTATE)
    snapshot = log_snapshot()
    with override_settings(ATLAS_MAX_BATCH_OPS=3):
        for dry_run in (False, True):
            response = api.post(
                f"{API}/delete-by-query", {"namespace": NS, "dry_run": dry_run}, format="json"
            )
            assert_problem(response, 413)
    assert_nothing_written(snapshot)


def test_delete_by_query_is_held_to_the_limit_by_the_service_too(root, namespace):
    changeset_apply(store=baseline, actor=root, ops=puts(4), rpc=Rpc.BATCH_MUTATE)
    deletes = [DeleteOp(op.key, missing_ok=True) for op in puts(4)]
    with override_settings(ATLAS_MAX_BATCH_OPS=3), pytest.raises(TooManyOps):
        changeset_apply(store=baseline, actor=root, ops=deletes, rpc=Rpc.DELETE_BY_QUERY)


def test_a_revert_over_the_limit_is_413_and_writes_nothing(api, root, namespace):
    big = changeset_apply(store=baseline, actor=root, ops=puts(4), rpc=Rpc.BATCH_MUTATE)
    snapshot = log_snapshot()
    with override_settings(ATLAS_MAX_BATCH_OPS=3):
        url = f"{API}/changesets/{big.changeset.id}/revert"
        assert_too_many(api.post(url, {}, format="json"), 4, 3)
        assert_too_many(api.post(url, {"dry_run": True}, format="json"), 4, 3)
        with pytest.raises(TooManyOps):
            changeset_revert(store=baseline, actor=root, changeset_id=str(big.changeset.id))
    assert_nothing_written(snapshot)


def test_an_import_over_the_limit_is_413_before_any_row_is_locked(
    api, root, namespace, monkeypatch
):
    exported = changeset_apply(store=baseline, actor=root, ops=puts(4), rpc=Rpc.BATCH_MUTATE)
    text = api.get(f"{API}/changesets/{exported.changeset.id}/export").getvalue().decode()
    undo = changeset_revert(store=baseline, actor=root, changeset_id=str(exported.changeset.id))
    assert undo.changeset is not None  # the file applies again: only the limit refuses it
    monkeypatch.setattr(type(baseline), "lock", _NoLocks.lock)
    snapshot = log_snapshot()
    with override_settings(ATLAS_MAX_BATCH_OPS=3):
        for query in ("", "?dry_run=true"):
            response = api.post(
                f"{API}/changesets/import{query}", text, content_type="application/x-ndjson"
            )
            assert_too_many(response, 4, 3)
    assert_nothing_written(snapshot)


def test_a_merge_over_the_limit_is_413_and_the_branch_stays_open(api, root, namespace):
    assert api.post(f"{API}/branches", {"name": "feature"}, format="json").status_code == 201
    ops = [
        {"op": "put", "namespace": NS, "kind": "event", "slug": f"e{i}", "content": {"i": i}}
        for i in range(4)
    ]
    written = api.post(f"{API}/batch", {"ops": ops}, format="json", **{BRANCH_HEADER: "feature"})
    assert written.status_code == 200, written.content
    snapshot = log_snapshot()
    with override_settings(ATLAS_MAX_BATCH_OPS=3):
        for dry_run in (True, False):
            response = api.post(
                f"{API}/branches/feature/merge", {"dry_run": dry_run}, format="json"
            )
            assert_too_many(response, 4, 3, what="Merging branch 'feature'")
    assert_nothing_written(snapshot)
    assert Branch.objects.get(name="feature").status == BranchStatus.OPEN
    merged = api.post(f"{API}/branches/feature/merge", {}, format="json")
    assert merged.status_code == 200, merged.content
    assert Changeset.objects.get(pk=merged.json()["changeset"]["id"]).op_count == 4


def test_the_refusal_is_problem_json_with_the_counts(api, root, namespace):
    big = changeset_apply(store=baseline, actor=root, ops=puts(12), rpc=Rpc.BATCH_MUTATE)
    with override_settings(ATLAS_MAX_BATCH_OPS=10):
        response = api.post(f"{API}/changesets/{big.changeset.id}/revert", {}, format="json")
    body = assert_too_many(response, 12, 10)
    assert json.loads(response.content) == body
