"""Who writes a branch (issue 13, item 4; API.md "Limits and visibility (added)").

A branch is written by its creator, its members
(``PUT|DELETE /branches/{name}/members/user/{username}``), maintainers of every
namespace it touched, and superusers; everyone else gets 404 if they cannot see
it, 403 if they can. Every write path under ``X-Atlas-Branch`` obeys it.
"""

from __future__ import annotations

from typing import Any

import pytest

from branches.models import Branch, BranchMember
from changesets.models import Changeset
from tests.atlas.test_errors import assert_problem
from tests.branches.conftest import BRANCH_HEADER, NS

pytestmark = pytest.mark.django_db

API = "/api/v1"
BRANCHES = f"{API}/branches"
SECRET = "acme.secret"


def on(branch: str) -> dict[str, str]:
    return {BRANCH_HEADER: branch}


def entity_url(slug: str, namespace: str = NS, kind: str = "order") -> str:
    return f"{API}/entities/{namespace}/{kind}/{slug}"


def put(client: Any, slug: str, content: dict, *, branch: str, namespace: str = NS) -> Any:
    return client.put(
        entity_url(slug, namespace), {"content": content}, format="json", **on(branch)
    )


def member_url(username: str, branch: str = "feature") -> str:
    return f"{BRANCHES}/{branch}/members/user/{username}"


@pytest.fixture
def feature(api, wendy, write):
    """Baseline a=1; wendy's branch ``feature`` has written a (so readers of NS see it)."""
    write(wendy, f"{NS}/order/a", {"n": 1})
    assert api.post(BRANCHES, {"name": "feature"}, format="json").status_code == 201
    assert put(api, "a", {"n": 2}, branch="feature").status_code == 200
    return "feature"


@pytest.fixture
def walt(make_user, namespace):
    """A writer of NS who is not a member of wendy's branch."""
    return make_user("walt", writer=[NS])


def branch_changesets() -> int:
    return Changeset.objects.filter(branch="feature").count()


# --- writes by others ----------------------------------------------------------


def test_a_writer_who_can_see_a_branch_but_is_not_its_member_is_refused_with_403(
    feature, client_for, walt
):
    client = client_for(walt)
    before = branch_changesets()
    assert client.get(f"{BRANCHES}/{feature}").status_code == 200  # he can see it
    batch = {"ops": [{"op": "put", "namespace": NS, "kind": "order", "slug": "b", "content": {}}]}
    for response in (
        put(client, "a", {"n": 3}, branch=feature),
        put(client, "new", {"n": 1}, branch=feature),
        client.patch(entity_url("a"), {"patch": {"m": 1}}, format="json", **on(feature)),
        client.delete(entity_url("a"), **on(feature)),
        client.post(f"{API}/batch", batch, format="json", **on(feature)),
        client.post(f"{API}/batch", {**batch, "dry_run": True}, format="json", **on(feature)),
        client.post(f"{API}/delete-by-query", {"namespace": NS}, format="json", **on(feature)),
    ):
        body = assert_problem(response, 403)
        assert "feature" in body["detail"]
    assert branch_changesets() == before
    # Baseline is his to write as before.
    assert client.put(entity_url("a"), {"content": {"n": 9}}, format="json").status_code == 200


def test_revert_and_import_under_the_header_obey_the_same_rule(
    api, feature, client_for, walt, write, wendy
):
    landed = write(wendy, f"{NS}/order/z", {"n": 1}).changeset
    exported = b"".join(api.get(f"{API}/changesets/{landed.id}/export").streaming_content)
    client = client_for(walt)
    before = branch_changesets()

    revert = client.post(f"{API}/changesets/{landed.id}/revert", {}, format="json", **on(feature))
    imported = client.post(
        f"{API}/changesets/import",
        exported,
        content_type="application/x-ndjson",
        **on(feature),
    )

    assert "feature" in assert_problem(revert, 403)["detail"]
    assert "feature" in assert_problem(imported, 403)["detail"]
    assert branch_changesets() == before


def test_a_writer_who_cannot_see_the_branch_gets_404(api, client_for, walt, namespace):
    assert api.post(BRANCHES, {"name": "quiet"}, format="json").status_code == 201
    body = assert_problem(put(client_for(walt), "a", {"n": 1}, branch="quiet"), 404)
    assert body["pointer"] == "/headers/X-Atlas-Branch"


def test_maintainers_of_every_touched_namespace_write_it_without_membership(
    feature, client_for, make_user
):
    mo = client_for(make_user("mo", maintainer=[NS]))
    assert put(mo, "a", {"n": 3}, branch=feature).status_code == 200
    # A namespace the branch did not touch yet counts too: maintainer there as well.
    half = client_for(make_user("hal", maintainer=[NS], writer=["acme.billing"]))
    assert_problem(put(half, "i", {"n": 1}, branch=feature, namespace="acme.billing"), 403)
    assert put(half, "a", {"n": 4}, branch=feature).status_code == 200


def test_superusers_write_any_branch(feature, client_for, superuser):
    assert put(client_for(superuser), "a", {"n": 3}, branch=feature).status_code == 200


# --- members -------------------------------------------------------------------


def test_the_creator_adds_a_member_who_then_writes_the_branch(api, feature, client_for, walt):
    added = api.put(member_url("walt"))
    assert added.status_code == 201
    assert added.json()["members"] == ["walt"] and added.json()["name"] == feature
    again = api.put(member_url("walt"), {}, format="json")
    assert again.status_code == 200 and again.json()["members"] == ["walt"]
    assert BranchMember.objects.filter(branch__name=feature).count() == 1

    client = client_for(walt)
    response = put(client, "a", {"n": 3}, branch=feature)
    assert response.status_code == 200, response.content
    assert response.json()["changeset"]["author"] == "walt"
    assert client.get(f"{BRANCHES}/{feature}").json()["members"] == ["walt"]
    assert [b["members"] for b in client.get(BRANCHES).json()["results"]] == [["walt"]]


def test_members_see_a_branch_that_touched_nothing_they_read(api, client_for, make_user):
    wendy_only = make_user("wanda", writer=["acme.billing"])
    assert api.post(BRANCHES, {"name": "feature"}, format="json").status_code == 201
    client = client_for(wendy_only)
    assert_problem(client.get(f"{BRANCHES}/feature"), 404)
    assert api.put(member_url("wanda")).status_code == 201
    assert client.get(f"{BRANCHES}/feature").status_code == 200
    assert [b["name"] for b in client.get(BRANCHES).json()["results"]] == ["feature"]
    response = put(client, "i", {"n": 1}, branch="feature", namespace="acme.billing")
    assert response.status_code == 201, response.content


def test_removing_a_member_stops_their_writes(api, feature, client_for, walt):
    api.put(member_url("walt"))
    client = client_for(walt)
    assert put(client, "a", {"n": 3}, branch=feature).status_code == 200

    removed = api.delete(member_url("walt"))
    assert removed.status_code == 204
    assert api.delete(member_url("walt")).status_code == 204  # not a member: still 204
    assert api.get(f"{BRANCHES}/{feature}").json()["members"] == []
    assert_problem(put(client, "a", {"n": 4}, branch=feature), 403)


def test_a_member_still_needs_the_writer_role_in_each_namespace(
    api, feature, client_for, make_user
):
    rita = make_user("rita", reader=[NS])
    api.put(member_url("rita"))
    client = client_for(rita)
    assert_problem(put(client, "a", {"n": 3}, branch=feature), 403)
    assert_problem(put(client, "x", {"n": 1}, branch=feature, namespace=SECRET), 404)
    assert branch_changesets() == 1


def test_members_are_managed_by_the_creator_maintainers_and_superusers_only(
    api, feature, client_for, make_user, walt, superuser
):
    api.put(member_url("walt"))
    make_user("vera", writer=[NS])
    # A member cannot add members; nor can a writer or a reader who sees the branch.
    for user in (walt, make_user("will", writer=[NS]), make_user("rita", reader=[NS])):
        body = assert_problem(client_for(user).put(member_url("vera")), 403)
        assert "feature" in body["detail"]
        assert_problem(client_for(user).delete(member_url("walt")), 403)
    mo = client_for(make_user("mo", maintainer=[NS]))
    assert mo.put(member_url("vera")).status_code == 201
    assert client_for(superuser).delete(member_url("vera")).status_code == 204
    assert api.get(f"{BRANCHES}/{feature}").json()["members"] == ["walt"]


def test_member_endpoints_answer_404_for_unknown_users_and_invisible_branches(
    api, feature, client_for, make_user
):
    assert_problem(api.put(member_url("nobody")), 404)
    assert_problem(api.delete(member_url("nobody")), 404)
    assert_problem(api.put(member_url("walt", branch="nope")), 404)
    stranger = client_for(make_user("sam", writer=["acme.billing"]))
    make_user("vera")
    assert_problem(stranger.put(member_url("vera")), 404)
    assert_problem(stranger.delete(member_url("vera")), 404)
    assert_problem(stranger.put(member_url("sam")), 404)  # nor add himself


def test_member_changes_on_a_closed_branch_are_409(api, feature, walt):
    api.put(member_url("walt"))
    assert api.delete(f"{BRANCHES}/{feature}").status_code == 200
    assert_problem(api.put(member_url("walt")), 409)
    assert_problem(api.delete(member_url("walt")), 409)


def test_member_put_takes_no_fields(api, feature, walt):
    assert_problem(
        api.put(member_url("walt"), {"role": "writer"}, format="json"),
        422,
        error_pointers=["/role"],
    )
    assert not BranchMember.objects.exists()


def test_members_abandon_the_branch_mere_writers_do_not(api, feature, client_for, walt):
    assert_problem(client_for(walt).delete(f"{BRANCHES}/{feature}"), 403)
    api.put(member_url("walt"))
    assert client_for(walt).delete(f"{BRANCHES}/{feature}").status_code == 200
    assert Branch.objects.get(name=feature).status == "abandoned"


# --- names and merges do not name what the caller cannot read --------------------


def test_creating_a_name_taken_by_an_invisible_branch_is_a_generic_409(
    client_for, make_user, namespace
):
    alice = make_user("alice", writer=[SECRET])
    alice_api = client_for(alice)
    assert alice_api.post(BRANCHES, {"name": "hidden"}, format="json").status_code == 201
    assert put(alice_api, "x", {"n": 1}, branch="hidden", namespace=SECRET).status_code == 201
    bob_api = client_for(make_user("bob", writer=[NS]))
    assert_problem(bob_api.get(f"{BRANCHES}/hidden"), 404)

    theirs = assert_problem(bob_api.post(BRANCHES, {"name": "hidden"}, format="json"), 409)
    own = assert_problem(alice_api.post(BRANCHES, {"name": "hidden"}, format="json"), 409)

    assert "alice" not in str(theirs) and SECRET not in str(theirs)
    assert theirs["detail"] == own["detail"]


def test_a_merge_with_changes_in_a_namespace_the_caller_cannot_read_is_403_without_naming_it(
    api, feature, client_for, make_user
):
    walt = client_for(make_user("walt", writer=[NS, SECRET]))
    api.put(member_url("walt"))
    assert put(walt, "x", {"n": 1}, branch=feature, namespace=SECRET).status_code == 201
    before = Changeset.objects.count()

    for body in ({}, {"dry_run": True}):
        problem = assert_problem(api.post(f"{BRANCHES}/{feature}/merge", body, format="json"), 403)
        assert SECRET not in str(problem) and "secret" not in problem["detail"]
        assert "1 namespace you cannot read" in problem["detail"]
    assert Changeset.objects.count() == before
    assert Branch.objects.get(name=feature).status == "open"
    # Someone who may write both lands it.
    merged = walt.post(f"{BRANCHES}/{feature}/merge", {}, format="json")
    assert merged.status_code == 200, merged.content


def test_a_merge_refused_for_a_readable_namespace_names_it_and_the_role(
    api, feature, client_for, make_user, protected_namespace
):
    make_user("wendy", writer=["acme.core"])
    put(api, "r", {"on": True}, branch=feature, namespace="acme.core")
    problem = assert_problem(api.post(f"{BRANCHES}/{feature}/merge", {}, format="json"), 403)
    assert "'acme.core' (needs maintainer)" in problem["detail"]
