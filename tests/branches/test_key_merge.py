"""Key-level merge with resolutions (API.md "Restore and key-level merge (added)").

``POST /branches/{name}/merge`` with ``"granularity": "key"``: per entity the
one three-way merge (base = baseline at the branch's base, ours = baseline
now, theirs = the branch); conflicts only where both changed one pointer
differently, settled by ``resolutions`` per pointer or per entity.
"""

from __future__ import annotations

from typing import Any

import pytest

from branches.models import BranchStatus
from changesets.models import Changeset, Revision
from entities.store import baseline
from tests.atlas.test_errors import assert_problem
from tests.branches.conftest import NS, key
from tests.changesets.helpers import assert_json_identical, assert_nothing_written, log_snapshot

pytestmark = pytest.mark.django_db

API = "/api/v1"
A = f"{NS}/order/a"
B = f"{NS}/order/b"


def content(path: str) -> Any:
    entity = baseline.get(key(path))
    return entity.content if entity is not None else None


def merge(api: Any, branch: Any, **body: Any) -> Any:
    return api.post(f"{API}/branches/{branch.name}/merge", body, format="json")


def ref(path: str, **more: Any) -> dict[str, Any]:
    ns, kind, slug = path.split("/")
    return {"namespace": ns, "kind": kind, "slug": slug, **more}


def conflict(path: str, pointer: str, base: Any, ours: Any, theirs: Any) -> dict[str, Any]:
    return {
        **ref(path),
        "pointer": pointer,
        "reason": "key_conflict",
        **locals_of(base, ours, theirs),
    }


def locals_of(base: Any, ours: Any, theirs: Any) -> dict[str, Any]:
    return {"base": base, "ours": ours, "theirs": theirs}


@pytest.fixture
def diverged(wendy, write, bwrite, make_branch):
    """Baseline a = {title, n, tags}; the branch renames it; baseline then bumps n."""
    write(wendy, A, {"title": "Order", "n": 1, "tags": ["x"]})
    branch = make_branch(wendy)
    bwrite(wendy, branch, A, {"title": "Order placed", "n": 1, "tags": ["x"]})
    write(wendy, A, {"title": "Order", "n": 2, "tags": ["x"]})
    return branch


def test_entity_granularity_still_refuses_what_key_granularity_merges(api, diverged):
    problem = assert_problem(merge(api, diverged), 409)
    assert [c["reason"] for c in problem["conflicts"]] == ["baseline_moved"]

    response = merge(api, diverged, granularity="key", comment="land the rename")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["changeset"]["rpc"] == "MergeBranch"
    assert body["merged"] == [ref(A)]
    assert body["branch"]["status"] == "merged"
    assert_json_identical(content(A), {"title": "Order placed", "n": 2, "tags": ["x"]})
    written = Revision.objects.get(changeset_id=body["changeset"]["id"])
    assert written.changed == ["/title"]  # only the branch's pointer moved on baseline


def test_a_dry_run_reports_and_writes_nothing(api, diverged):
    before = log_snapshot()
    response = merge(api, diverged, granularity="key", dry_run=True)
    assert response.status_code == 200, response.content
    assert response.json()["changeset"] is None and response.json()["dry_run"] is True
    assert response.json()["merged"] == [ref(A)]
    assert_nothing_written(before)
    diverged.refresh_from_db()
    assert diverged.status == BranchStatus.OPEN


def test_both_sides_changing_one_pointer_is_a_409_naming_it(api, wendy, write, bwrite, diverged):
    write(wendy, A, {"title": "Order received", "n": 2, "tags": ["x"]})
    bwrite(wendy, diverged, B, {"n": 1})  # a clean change elsewhere does not land alone
    before = log_snapshot()
    problem = assert_problem(merge(api, diverged, granularity="key"), 409)
    assert problem["type"].endswith("merge-conflict")
    assert problem["conflicts"] == [
        conflict(A, "/title", "Order", "Order received", "Order placed")
    ]
    assert_nothing_written(before)
    diverged.refresh_from_db()
    assert diverged.status == BranchStatus.OPEN


@pytest.mark.parametrize(
    ("take", "title"), [("branch", "Order placed"), ("baseline", "Order received")]
)
def test_a_pointer_resolution_settles_that_conflict_and_the_rest_still_lands(
    api, wendy, write, bwrite, diverged, take, title
):
    write(wendy, A, {"title": "Order received", "n": 2, "tags": ["x"]})
    bwrite(wendy, diverged, A, {"title": "Order placed", "n": 1, "tags": ["y"]})
    response = merge(
        api, diverged, granularity="key", resolutions=[ref(A, pointer="/title", take=take)]
    )
    assert response.status_code == 200, response.content
    assert_json_identical(content(A), {"title": title, "n": 2, "tags": ["y"]})


def test_a_whole_entity_resolution_takes_that_side_entirely(api, wendy, write, diverged):
    write(wendy, A, {"title": "Order received", "n": 3, "tags": ["x"]})
    response = merge(api, diverged, granularity="key", resolutions=[ref(A, take="branch")])
    assert response.status_code == 200, response.content
    assert_json_identical(content(A), {"title": "Order placed", "n": 1, "tags": ["x"]})


def test_taking_baseline_for_everything_closes_the_branch_without_a_changeset(
    api, wendy, write, diverged
):
    write(wendy, A, {"title": "Order received", "n": 3, "tags": ["x"]})
    before = log_snapshot()
    response = merge(api, diverged, granularity="key", resolutions=[ref(A, take="baseline")])
    assert response.status_code == 200, response.content
    assert response.json()["changeset"] is None and response.json()["merged"] == []
    assert response.json()["branch"]["status"] == "merged"
    assert_nothing_written(before)
    assert content(A)["title"] == "Order received"


def test_a_branch_delete_against_a_baseline_edit_is_a_whole_entity_conflict(
    api, wendy, write, bwrite, make_branch
):
    write(wendy, A, {"n": 1})
    branch = make_branch(wendy)
    bwrite(wendy, branch, A, None)
    write(wendy, A, {"n": 2})
    problem = assert_problem(merge(api, branch, granularity="key"), 409)
    assert problem["conflicts"] == [conflict(A, "", {"n": 1}, {"n": 2}, None)]
    response = merge(
        api, branch, granularity="key", resolutions=[ref(A, pointer="", take="branch")]
    )
    assert response.status_code == 200, response.content
    assert content(A) is None


def test_the_base_is_what_the_branch_saw_when_it_first_wrote_the_entity(
    api, wendy, write, bwrite, make_branch
):
    """Baseline renamed the entity after the fork but before the branch wrote it: the
    branch saw that rename, so a second rename on baseline is no conflict with it."""
    write(wendy, A, {"title": "v1", "n": 1})
    branch = make_branch(wendy)
    write(wendy, A, {"title": "v2", "n": 1})
    bwrite(wendy, branch, A, {"title": "v2", "n": 5})
    write(wendy, A, {"title": "v3", "n": 1})
    response = merge(api, branch, granularity="key")
    assert response.status_code == 200, response.content
    assert_json_identical(content(A), {"title": "v3", "n": 5})


def test_a_create_on_both_sides_with_equal_content_lands_nothing_for_it(
    api, wendy, write, bwrite, make_branch
):
    branch = make_branch(wendy)
    bwrite(wendy, branch, A, {"n": 1})
    bwrite(wendy, branch, B, {"n": 1})
    write(wendy, A, {"n": 1})
    response = merge(api, branch, granularity="key")
    assert response.status_code == 200, response.content
    assert response.json()["merged"] == [ref(B)]
    landed = Changeset.objects.get(pk=response.json()["changeset"]["id"])
    assert [r.slug for r in landed.revisions.all()] == ["b"]


@pytest.mark.parametrize(
    ("body", "pointers"),
    [
        ({"granularity": "pointer"}, ["/granularity"]),
        ({"granularity": "key", "resolutions": [ref(A)]}, ["/resolutions/0/take"]),
        (
            {"granularity": "key", "resolutions": [ref(A, take="mine")]},
            ["/resolutions/0/take"],
        ),
        (
            {"granularity": "key", "resolutions": [ref(A, take="branch", pointer="title")]},
            ["/resolutions/0/pointer"],
        ),
        ({"granularity": "key", "resolutions": "all"}, ["/resolutions"]),
        ({"resolutions": [ref(A, take="branch")]}, ["/resolutions"]),
    ],
)
def test_bad_granularity_or_resolutions_are_422(api, diverged, body, pointers):
    before = log_snapshot()
    problem = assert_problem(merge(api, diverged, **body), 422)
    assert [e["pointer"] for e in problem["errors"]] == pointers
    assert_nothing_written(before)


def test_a_caller_without_write_rights_learns_no_conflict_content(
    make_user, client_for, wendy, write, diverged
):
    write(wendy, A, {"title": "Order received", "n": 2, "tags": ["x"]})
    reader = make_user("rita", reader=[NS])
    problem = assert_problem(merge(client_for(reader), diverged, granularity="key"), 403)
    assert "conflicts" not in problem


def test_the_schema_documents_key_merge_and_sync(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    merge_body = schema["components"]["schemas"]["MergeBodyRequest"]["properties"]
    assert {"granularity", "resolutions"} <= set(merge_body)
    assert "/api/v1/branches/{name}/sync" in schema["paths"]
