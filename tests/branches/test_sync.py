"""Branch sync (API.md "Restore and key-level merge (added)", Sync).

``POST /branches/{name}/sync`` moves the branch's base point to baseline's
head: reads under the branch then show baseline's newer changes wherever the
branch did not change the same pointer, ``behind`` is 0, and a later merge
finds nothing the sync settled. Conflicts → 409, nothing changed.
"""

from __future__ import annotations

from typing import Any

import pytest

from branches.models import Branch
from branches.store import BranchStore
from branches.sync import branch_sync
from changesets.models import Changeset, Revision
from entities.store import baseline
from tests.atlas.test_errors import assert_problem
from tests.branches.conftest import BRANCH_HEADER, NS, key, overlay
from tests.changesets.helpers import assert_json_identical, assert_nothing_written, log_snapshot

pytestmark = pytest.mark.django_db

API = "/api/v1"
A = f"{NS}/order/a"
B = f"{NS}/order/b"
C = f"{NS}/order/c"


def sync(api: Any, branch: Branch, **body: Any) -> Any:
    return api.post(f"{API}/branches/{branch.name}/sync", body, format="json")


def on_branch(branch: Branch, path: str) -> Any:
    entity = BranchStore(branch).get(key(path))
    return entity.content if entity is not None else None


def ref(path: str, **more: Any) -> dict[str, Any]:
    ns, kind, slug = path.split("/")
    return {"namespace": ns, "kind": kind, "slug": slug, **more}


def behind(api: Any, branch: Branch) -> int:
    return api.get(f"{API}/branches/{branch.name}/diff").json()["behind"]


@pytest.fixture
def diverged(wendy, write, bwrite, make_branch):
    """a: the branch renames it, baseline then bumps n. b: only baseline changes it."""
    write(wendy, A, {"title": "Order", "n": 1})
    write(wendy, B, {"n": 1})
    branch = make_branch(wendy)
    bwrite(wendy, branch, A, {"title": "Order placed", "n": 1})
    write(wendy, A, {"title": "Order", "n": 2})
    write(wendy, B, {"n": 2})
    return branch


def test_sync_merges_baseline_into_the_branch_and_moves_the_base_point(api, wendy, diverged):
    assert behind(api, diverged) == 2
    head = Changeset.objects.filter(branch="").order_by("-seq").first()

    response = sync(api, diverged, comment="catch up")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["changeset"]["rpc"] == "SyncBranch"
    assert body["changeset"]["branch"] == diverged.name
    assert body["changeset"]["comment"] == "catch up"
    merged = {"title": "Order placed", "n": 2}
    assert body["ops"] == [{"op": "put", **ref(A), "content": merged}]
    assert body["branch"]["base_changeset_id"] == str(head.id)
    assert body["branch"]["base_seq"] == head.seq
    assert body["branch"]["synced_at"] is not None
    assert body["branch"]["fork_seq"] < head.seq  # the fork stays where it was

    assert_json_identical(on_branch(diverged, A), merged)
    assert on_branch(diverged, B) == {"n": 2}  # read through, as before
    assert behind(api, diverged) == 0
    row = overlay(diverged)[key(A)]
    assert row.base_version == baseline.get(key(A)).version
    # The sync's revision is the branch's view moving from its content to the merge.
    revision = Revision.objects.get(changeset_id=body["changeset"]["id"])
    assert (revision.before, revision.after, revision.changed) == (
        {"title": "Order placed", "n": 1},
        merged,
        ["/n"],
    )


def test_after_a_sync_the_entity_merge_finds_no_conflict(api, diverged):
    assert_problem(api.post(f"{API}/branches/{diverged.name}/merge", {}, format="json"), 409)
    assert sync(api, diverged).status_code == 200
    response = api.post(f"{API}/branches/{diverged.name}/merge", {}, format="json")
    assert response.status_code == 200, response.content
    assert_json_identical(baseline.get(key(A)).content, {"title": "Order placed", "n": 2})


def test_a_dry_run_reports_the_ops_and_moves_nothing(api, diverged):
    before = log_snapshot()
    response = sync(api, diverged, dry_run=True)
    assert response.status_code == 200, response.content
    assert response.json()["changeset"] is None and response.json()["dry_run"] is True
    assert [op["slug"] for op in response.json()["ops"]] == ["a"]
    assert_nothing_written(before)
    assert behind(api, diverged) == 2
    assert response.json()["branch"]["synced_at"] is None


def test_a_sync_with_no_content_to_merge_moves_the_base_point_without_a_changeset(
    api, wendy, write, bwrite, make_branch
):
    write(wendy, A, {"n": 1})
    branch = make_branch(wendy)
    bwrite(wendy, branch, B, {"n": 1})  # baseline never touches b
    write(wendy, A, {"n": 2})
    before = log_snapshot()
    response = sync(api, branch)
    assert response.status_code == 200, response.content
    assert response.json()["changeset"] is None and response.json()["ops"] == []
    assert_nothing_written(before)
    assert behind(api, branch) == 0


def test_a_conflict_is_409_and_changes_nothing(api, wendy, write, diverged):
    write(wendy, A, {"title": "Order received", "n": 2})
    before = log_snapshot()
    base_seq = Branch.objects.get(pk=diverged.pk).base_seq
    problem = assert_problem(sync(api, diverged), 409)
    assert problem["type"].endswith("sync-conflict")
    assert problem["conflicts"] == [
        {
            **ref(A),
            "pointer": "/title",
            "reason": "key_conflict",
            "base": "Order",
            "ours": "Order received",
            "theirs": "Order placed",
        }
    ]
    assert_nothing_written(before)
    assert Branch.objects.get(pk=diverged.pk).base_seq == base_seq
    assert overlay(diverged)[key(A)].content == {"title": "Order placed", "n": 1}


@pytest.mark.parametrize(
    ("resolution", "expected"),
    [
        ({"pointer": "/title", "take": "branch"}, {"title": "Order placed", "n": 2}),
        ({"pointer": "/title", "take": "baseline"}, {"title": "Order received", "n": 2}),
        ({"take": "baseline"}, {"title": "Order received", "n": 2}),
        ({"take": "branch"}, {"title": "Order placed", "n": 1}),
    ],
)
def test_resolutions_settle_sync_conflicts(api, wendy, write, diverged, resolution, expected):
    write(wendy, A, {"title": "Order received", "n": 2})
    response = sync(api, diverged, resolutions=[ref(A, **resolution)])
    assert response.status_code == 200, response.content
    assert_json_identical(on_branch(diverged, A), expected)
    assert behind(api, diverged) == 0


def test_entity_granularity_refuses_any_entity_both_changed(api, diverged):
    problem = assert_problem(sync(api, diverged, granularity="entity"), 409)
    assert [(c["slug"], c["pointer"]) for c in problem["conflicts"]] == [("a", "")]
    assert problem["conflicts"][0]["theirs"] == {"title": "Order placed", "n": 1}


def test_a_branch_tombstone_against_a_baseline_edit_conflicts_at_the_whole_document(
    api, wendy, write, bwrite, make_branch
):
    write(wendy, A, {"n": 1})
    branch = make_branch(wendy)
    bwrite(wendy, branch, A, None)
    write(wendy, A, {"n": 2})
    problem = assert_problem(sync(api, branch), 409)
    assert [(c["pointer"], c["theirs"]) for c in problem["conflicts"]] == [("", None)]
    response = sync(api, branch, resolutions=[ref(A, take="branch")])
    assert response.status_code == 200, response.content
    assert on_branch(branch, A) is None
    assert response.json()["changeset"] is None  # the tombstone stays; only its base moves
    assert behind(api, branch) == 0


def test_a_baseline_delete_under_an_untouched_pointer_set_is_carried_into_the_branch(
    api, wendy, write, bwrite, make_branch
):
    write(wendy, A, {"n": 1})
    branch = make_branch(wendy)
    bwrite(wendy, branch, C, {"n": 1})
    write(wendy, C, {"n": 1})  # baseline creates the same entity equally
    response = sync(api, branch)
    assert response.status_code == 200, response.content
    assert response.json()["ops"] == []
    assert overlay(branch)[key(C)].base_version == 1


def test_sync_needs_the_branch_writer_rule_and_a_visible_open_branch(
    make_user, client_for, api, diverged
):
    reader = make_user("rita", reader=[NS])
    assert_problem(sync(client_for(reader), diverged), 403)
    stranger = make_user("sam")
    assert_problem(sync(client_for(stranger), diverged), 404)
    api.delete(f"{API}/branches/{diverged.name}")
    assert_problem(sync(api, diverged), 409)


def test_reads_under_the_branch_after_a_sync_show_baselines_newer_changes(api, diverged):
    sync(api, diverged)
    response = api.get(f"{API}/entities/{NS}/order/a", **{BRANCH_HEADER: diverged.name})
    assert response.json()["content"] == {"title": "Order placed", "n": 2}


def test_the_service_syncs_an_empty_log_branch(wendy, make_branch):
    branch = make_branch(wendy)
    result = branch_sync(branch=branch, actor=wendy)
    assert result.changeset is None
    assert (result.branch.base_seq, result.branch.base_changeset_id) == (0, None)
