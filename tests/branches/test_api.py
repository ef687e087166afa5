"""The branch HTTP API and ``X-Atlas-Branch`` on every entity endpoint.

Everything goes through ``APIClient`` with token auth, checked against API.md
("Branches", the branch header, "Decisions that close open points").
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from django.test import override_settings

from branches.models import Branch, BranchStatus
from changesets.models import Changeset, Revision
from tests.atlas.test_errors import assert_problem
from tests.branches.conftest import BRANCH_HEADER, NS

pytestmark = pytest.mark.django_db

API = "/api/v1"
BRANCHES = f"{API}/branches"
ENTITIES = f"{API}/entities"
BRANCH_FIELDS = {
    "name",
    "status",
    "created_by",
    "created_at",
    "fork_changeset_id",
    "fork_seq",
    "base_changeset_id",
    "base_seq",
    "synced_at",
    "merged_changeset_id",
    "comment",
    "closed_at",
    "namespaces",
    "members",
}


def entity_url(slug: str, namespace: str = NS, kind: str = "order") -> str:
    return f"{ENTITIES}/{namespace}/{kind}/{slug}"


def on(branch: str) -> dict[str, str]:
    return {BRANCH_HEADER: branch}


def put(client: Any, slug: str, content: dict, *, branch: str | None = None, **kw: Any) -> Any:
    headers = on(branch) if branch else {}
    return client.put(entity_url(slug), {"content": content}, format="json", **headers, **kw)


@pytest.fixture
def feature(api, wendy, write):
    """Baseline a=1, b=1 and a branch ``feature`` cut by wendy (via the API)."""
    write(wendy, f"{NS}/order/a", {"n": 1})
    write(wendy, f"{NS}/order/b", {"n": 1})
    response = api.post(BRANCHES, {"name": "feature"}, format="json")
    assert response.status_code == 201, response.content
    return "feature"


# --- create, get, list ---------------------------------------------------------


def test_create_answers_201_with_the_branch(api, write, wendy):
    newest = write(wendy, f"{NS}/order/a", {"n": 1}).changeset
    response = api.post(BRANCHES, {"name": "feature", "comment": "why"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert set(body) == BRANCH_FIELDS
    assert body["name"] == "feature" and body["status"] == "open"
    assert body["created_by"] == wendy.username
    assert body["fork_changeset_id"] == str(newest.id)
    assert body["fork_seq"] == newest.seq
    assert body["merged_changeset_id"] is None and body["closed_at"] is None
    assert body["comment"] == "why" and body["namespaces"] == [] and body["members"] == []
    assert body["created_at"].endswith("Z")
    assert response["Location"].endswith("/api/v1/branches/feature")
    assert api.get(f"{BRANCHES}/feature").json() == body


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"name": "Bad Name"}, "/name"),
        ({"name": 7}, "/name"),
        ({}, "/name"),
        ({"name": "ok", "author": "x"}, "/author"),
        ({"name": "ok", "comment": 3}, "/comment"),
    ],
)
def test_create_refuses_invalid_bodies_with_422(api, namespace, body, pointer):
    assert_problem(api.post(BRANCHES, body, format="json"), 422, error_pointers=[pointer])


def test_create_refuses_a_taken_name_with_409(api, feature):
    assert_problem(api.post(BRANCHES, {"name": feature}, format="json"), 409)


def test_create_needs_a_writer_and_a_user(client_for, make_user, namespace):
    reader = make_user("rita", reader=[NS])
    assert_problem(client_for(reader).post(BRANCHES, {"name": "x"}, format="json"), 403)
    assert client_for(None).post(BRANCHES, {"name": "x"}, format="json").status_code == 401


@pytest.mark.parametrize("name", ["Feature", "a%20b", "-x", "x" * 64, "no_such"])
def test_invalid_or_unknown_names_in_the_path_are_404(api, feature, name):
    for path in (f"{BRANCHES}/{name}", f"{BRANCHES}/{name}/diff"):
        assert_problem(api.get(path), 404)
    assert_problem(api.post(f"{BRANCHES}/{name}/merge", {}, format="json"), 404)
    assert_problem(api.delete(f"{BRANCHES}/{name}"), 404)


def test_list_pages_visible_branches_by_name(api, wendy, namespace):
    for name in ["e", "b", "d", "a", "c"]:
        assert api.post(BRANCHES, {"name": name}, format="json").status_code == 201
    names, token = [], None
    while True:
        params = {"page_size": 2, **({"page_token": token} if token else {})}
        body = api.get(BRANCHES, params).json()
        names += [b["name"] for b in body["results"]]
        token = body["next_page_token"]
        if token is None:
            break
    assert names == ["a", "b", "c", "d", "e"]


def test_list_filters_by_status(api, feature):
    api.post(BRANCHES, {"name": "other"}, format="json")
    api.delete(f"{BRANCHES}/other")
    assert [b["name"] for b in api.get(BRANCHES, {"status": "open"}).json()["results"]] == [
        "feature"
    ]
    abandoned = api.get(BRANCHES, {"status": "abandoned"}).json()["results"]
    assert [b["name"] for b in abandoned] == ["other"]
    assert_problem(api.get(BRANCHES, {"status": "closed"}), 422, error_pointers=["/status"])
    assert_problem(api.get(BRANCHES, {"bogus": 1}), 422)
    token = api.get(BRANCHES, {"status": "open", "page_size": 1}).json()["next_page_token"]
    assert token is None


def test_a_page_token_of_another_listing_is_400(api, feature):
    api.post(BRANCHES, {"name": "other"}, format="json")
    token = api.get(BRANCHES, {"page_size": 1}).json()["next_page_token"]
    assert_problem(api.get(BRANCHES, {"status": "open", "page_token": token}), 400)


# --- visibility ----------------------------------------------------------------


def test_visibility_creator_readers_of_touched_namespaces_and_superusers(
    api, feature, client_for, make_user, superuser
):
    reader = client_for(make_user("rita", reader=[NS]))
    stranger = client_for(make_user("sam", reader=["acme.billing"]))
    # Untouched: only the creator (and superusers) can see it.
    assert_problem(reader.get(f"{BRANCHES}/{feature}"), 404)
    assert reader.get(BRANCHES).json()["results"] == []
    assert client_for(superuser).get(f"{BRANCHES}/{feature}").status_code == 200

    assert put(api, "a", {"n": 2}, branch=feature).status_code == 200

    # Touched acme.orders: its readers now see the branch and read through it.
    assert reader.get(f"{BRANCHES}/{feature}").status_code == 200
    assert [b["name"] for b in reader.get(BRANCHES).json()["results"]] == [feature]
    assert reader.get(entity_url("a"), **on(feature)).json()["content"] == {"n": 2}
    assert reader.get(f"{BRANCHES}/{feature}/diff").status_code == 200
    # ... but cannot write it (writer needed), nor merge it.
    assert_problem(put(reader, "a", {"n": 3}, branch=feature), 403)
    assert_problem(reader.post(f"{BRANCHES}/{feature}/merge", {}, format="json"), 403)
    # Others cannot tell it exists.
    for response in (
        stranger.get(f"{BRANCHES}/{feature}"),
        stranger.get(f"{BRANCHES}/{feature}/diff"),
        stranger.post(f"{BRANCHES}/{feature}/merge", {}, format="json"),
        stranger.delete(f"{BRANCHES}/{feature}"),
        stranger.get(entity_url("a"), **on(feature)),
    ):
        assert_problem(response, 404)
    assert stranger.get(BRANCHES).json()["results"] == []


def test_branch_namespaces_are_shown_only_where_readable(
    client_for, make_user, make_branch, bwrite
):
    wendy = make_user("wendy", writer=[NS, "acme.billing"])
    branch = make_branch(wendy)
    bwrite(wendy, branch, f"{NS}/order/a", {"n": 1})
    bwrite(wendy, branch, "acme.billing/invoice/i", {"n": 1})
    reader = client_for(make_user("rita", reader=[NS]))
    assert reader.get(f"{BRANCHES}/feature").json()["namespaces"] == [NS]
    assert client_for(wendy).get(f"{BRANCHES}/feature").json()["namespaces"] == [
        "acme.billing",
        NS,
    ]


# --- the branch header on entity endpoints -------------------------------------


@pytest.mark.parametrize("name", ["nope", "Bad Name", "x" * 80])
def test_unknown_or_invalid_branch_header_is_404_with_pointer(api, namespace, name):
    for response in (
        api.get(entity_url("a"), **on(name)),
        api.get(ENTITIES, **on(name)),
        api.get(f"{entity_url('a')}/history", **on(name)),
        put(api, "a", {"n": 1}, branch=name),
        api.post(f"{API}/batch", {"ops": []}, format="json", **on(name)),
    ):
        body = assert_problem(response, 404)
        assert body["pointer"] == "/headers/X-Atlas-Branch"


def test_entity_writes_under_the_header_land_on_the_branch_only(api, feature):
    created = put(api, "new", {"n": 1}, branch=feature)
    assert created.status_code == 201
    assert created.json()["changeset"]["branch"] == feature
    assert created["ETag"] == '"1"'
    updated = put(api, "a", {"n": 2}, branch=feature, HTTP_IF_MATCH='"1"')
    assert updated.status_code == 200 and updated.json()["entity"]["version"] == 2
    patched = api.patch(entity_url("a"), {"patch": {"m": 1}}, format="json", **on(feature))
    assert patched.json()["entity"]["content"] == {"n": 2, "m": 1}
    deleted = api.delete(entity_url("b"), **on(feature))
    assert deleted.status_code == 200 and deleted.json()["status"] == "deleted"

    # The branch's view ...
    assert api.get(entity_url("a"), **on(feature)).json()["content"] == {"n": 2, "m": 1}
    assert_problem(api.get(entity_url("b"), **on(feature)), 404)
    listed = api.get(ENTITIES, {"namespace": NS}, **on(feature)).json()["results"]
    assert [(e["slug"], e["version"]) for e in listed] == [("a", 3), ("new", 1)]
    # ... and baseline, untouched.
    assert api.get(entity_url("a")).json()["content"] == {"n": 1}
    assert api.get(entity_url("b")).status_code == 200
    assert_problem(api.get(entity_url("new")), 404)
    assert [e["slug"] for e in api.get(ENTITIES).json()["results"]] == ["a", "b"]


def test_batch_and_delete_by_query_under_the_header(api, feature):
    batch = api.post(
        f"{API}/batch",
        {
            "ops": [
                {"op": "put", "namespace": NS, "kind": "order", "slug": "c", "content": {}},
                {"op": "delete", "namespace": NS, "kind": "order", "slug": "a", "if_match": 1},
            ]
        },
        format="json",
        **on(feature),
    )
    assert batch.status_code == 200, batch.content
    assert batch.json()["changeset"]["branch"] == feature
    dbq = api.post(
        f"{API}/delete-by-query", {"namespace": NS, "kind": "order"}, format="json", **on(feature)
    )
    assert dbq.status_code == 200
    assert dbq.json()["deleted"] == 2  # b (read through) and c (the branch's own)
    assert dbq.json()["changeset"]["branch"] == feature
    assert api.get(ENTITIES, **on(feature)).json()["results"] == []
    assert [e["slug"] for e in api.get(ENTITIES).json()["results"]] == ["a", "b"]


def test_history_under_the_header_shows_the_branch_revisions(api, feature):
    put(api, "a", {"n": 2}, branch=feature)
    put(api, "a", {"n": 3}, branch=feature)
    put(api, "a", {"n": 9})  # baseline

    branch_history = api.get(f"{entity_url('a')}/history", **on(feature)).json()["results"]
    assert [(r["branch"], r["before_version"], r["after_version"]) for r in branch_history] == [
        (feature, 2, 3),
        (feature, 1, 2),
    ]
    base_history = api.get(f"{entity_url('a')}/history").json()["results"]
    assert [(r["branch"], r["after_version"]) for r in base_history] == [("", 2), ("", 1)]


def test_changeset_list_filters_by_branch(api, feature):
    put(api, "a", {"n": 2}, branch=feature)
    put(api, "c", {"n": 2}, branch=feature)
    put(api, "b", {"n": 2})

    on_branch = api.get(f"{API}/changesets", {"branch": feature}).json()["results"]
    assert [c["branch"] for c in on_branch] == [feature, feature]
    assert {c["ops"][0]["slug"] for c in on_branch} == {"a", "c"}
    on_baseline = api.get(f"{API}/changesets", {"branch": ""}).json()["results"]
    assert {c["branch"] for c in on_baseline} == {""}
    assert "feature" not in {c["branch"] for c in on_baseline}
    everything = api.get(f"{API}/changesets").json()["results"]
    assert len(everything) == len(on_branch) + len(on_baseline)


def test_idempotent_branch_write_replays(api, feature):
    first = put(api, "a", {"n": 2}, branch=feature, HTTP_IDEMPOTENCY_KEY="k1")
    again = put(api, "a", {"n": 2}, branch=feature, HTTP_IDEMPOTENCY_KEY="k1")
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert Changeset.objects.filter(branch=feature).count() == 1
    # The header is part of the request: the same key on baseline is another request.
    assert_problem(put(api, "a", {"n": 2}, HTTP_IDEMPOTENCY_KEY="k1"), 422)


# --- diff, merge, abandon ------------------------------------------------------


def test_diff_endpoint(api, feature, django_assert_max_num_queries):
    put(api, "a", {"n": 2}, branch=feature)
    api.delete(entity_url("b"), **on(feature))
    put(api, "c", {"n": 1}, branch=feature)
    put(api, "a", {"n": 5})  # baseline moves a

    with django_assert_max_num_queries(8):
        response = api.get(f"{BRANCHES}/{feature}/diff")

    assert response.status_code == 200
    assert response.json() == {
        "behind": 1,
        "ahead": 3,
        "changes": [
            {
                "namespace": NS,
                "kind": "order",
                "slug": "a",
                "op": "update",
                "base_version": 1,
                "baseline_version": 2,
                "conflict": True,
            },
            {
                "namespace": NS,
                "kind": "order",
                "slug": "b",
                "op": "delete",
                "base_version": 1,
                "baseline_version": 1,
                "conflict": False,
            },
            {
                "namespace": NS,
                "kind": "order",
                "slug": "c",
                "op": "create",
                "base_version": None,
                "baseline_version": None,
                "conflict": False,
            },
        ],
        "next_page_token": None,
    }


def test_diff_pages_its_changes_in_key_order(api, feature, write, wendy):
    for slug in ["e", "c", "a", "d", "b"]:
        put(api, slug, {"n": 7}, branch=feature)
    put(api, "z", {"n": 1})  # baseline moves on once
    url = f"{BRANCHES}/{feature}/diff"

    slugs, token, pages = [], None, 0
    while True:
        body = api.get(url, {"page_size": 2, **({"page_token": token} if token else {})}).json()
        pages += 1
        assert (body["behind"], body["ahead"]) == (1, 5)  # whole counts on every page
        assert len(body["changes"]) <= 2
        slugs += [c["slug"] for c in body["changes"]]
        token = body["next_page_token"]
        if token is None:
            break

    assert slugs == ["a", "b", "c", "d", "e"] and pages == 3
    assert api.get(url).json()["next_page_token"] is None  # default page (50) holds all


def test_diff_page_tokens_and_sizes_are_checked(api, feature, client_for, make_user):
    put(api, "a", {"n": 2}, branch=feature)
    put(api, "c", {"n": 2}, branch=feature)
    api.post(BRANCHES, {"name": "other"}, format="json")
    url = f"{BRANCHES}/{feature}/diff"
    token = api.get(url, {"page_size": 1}).json()["next_page_token"]
    assert token

    assert_problem(api.get(url, {"page_token": "garbage"}), 400)
    assert_problem(api.get(f"{BRANCHES}/other/diff", {"page_token": token}), 400)
    assert_problem(api.get(BRANCHES, {"page_token": token}), 400)
    reader = client_for(make_user("rita", reader=[NS]))
    assert_problem(reader.get(url, {"page_token": token}), 400)  # another user's token
    assert_problem(api.get(url, {"page_size": 0}), 422, error_pointers=["/page_size"])
    assert_problem(api.get(url, {"after": "x"}), 422)
    assert [c["slug"] for c in api.get(url, {"page_token": token}).json()["changes"]] == ["c"]


@override_settings(ATLAS_MAX_BATCH_OPS=2)
def test_merge_over_the_op_limit_is_refused_with_413(api, feature):
    for slug in ["a", "b", "c"]:
        put(api, slug, {"n": 5}, branch=feature)
    before = Changeset.objects.count()
    url = f"{BRANCHES}/{feature}/merge"

    for body in ({}, {"dry_run": True}):
        problem = assert_problem(api.post(url, body, format="json"), 413)
        assert "3 ops; the limit is 2" in problem["detail"]

    assert Changeset.objects.count() == before
    assert Branch.objects.get(name=feature).status == BranchStatus.OPEN
    assert api.get(entity_url("a")).json()["content"] == {"n": 1}
    # Back at the limit, it lands: c is new on the branch, and deleting it again
    # leaves nothing to land for it.
    api.delete(entity_url("c"), **on(feature))
    assert api.post(url, {}, format="json").status_code == 200


def test_merge_endpoint_lands_the_branch(api, feature, client_for, make_user):
    put(api, "a", {"n": 2}, branch=feature)
    put(api, "c", {"n": 1}, branch=feature)
    merger = client_for(make_user("mallory", writer=[NS]))

    dry = merger.post(f"{BRANCHES}/{feature}/merge", {"dry_run": True}, format="json")
    assert dry.status_code == 200
    assert dry.json()["changeset"] is None and dry.json()["dry_run"] is True
    assert [m["slug"] for m in dry.json()["merged"]] == ["a", "c"]

    response = merger.post(f"{BRANCHES}/{feature}/merge", {"comment": "land it"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is False
    assert body["merged"] == [
        {"namespace": NS, "kind": "order", "slug": "a"},
        {"namespace": NS, "kind": "order", "slug": "c"},
    ]
    changeset = body["changeset"]
    assert changeset["rpc"] == "MergeBranch" and changeset["branch"] == ""
    assert changeset["author"] == "mallory" and changeset["comment"] == "land it"
    assert [(o["slug"], o["op"]) for o in changeset["ops"]] == [("a", "update"), ("c", "create")]
    assert body["branch"]["status"] == "merged"
    assert body["branch"]["merged_changeset_id"] == changeset["id"]
    assert api.get(entity_url("a")).json()["content"] == {"n": 2}
    # It is in the baseline list, and closed branches refuse writes.
    assert api.get(f"{API}/changesets", {"branch": "", "rpc": "MergeBranch"}).json()["results"]
    assert_problem(put(api, "a", {"n": 3}, branch=feature), 409)
    assert_problem(api.post(f"{BRANCHES}/{feature}/merge", {}, format="json"), 409)
    assert_problem(api.delete(f"{BRANCHES}/{feature}"), 409)
    # Reads under a merged branch still work (they see baseline).
    assert api.get(entity_url("a"), **on(feature)).json()["content"] == {"n": 2}


def test_conflicting_merge_is_409_with_conflicts(api, feature):
    put(api, "a", {"n": 2}, branch=feature)
    put(api, "a", {"n": 3})
    revisions = Revision.objects.count()

    body = assert_problem(api.post(f"{BRANCHES}/{feature}/merge", {}, format="json"), 409)

    assert body["conflicts"] == [
        {
            "namespace": NS,
            "kind": "order",
            "slug": "a",
            "reason": "baseline_moved",
            "op": "update",
            "base_version": 1,
            "baseline_version": 2,
        }
    ]
    assert Revision.objects.count() == revisions
    assert Branch.objects.get(name=feature).status == BranchStatus.OPEN


@pytest.mark.parametrize(
    ("body", "pointer"),
    [({"dry_run": "yes"}, "/dry_run"), ({"force": True}, "/force"), ([], "/")],
)
def test_merge_refuses_invalid_bodies(api, feature, body, pointer):
    response = api.post(f"{BRANCHES}/{feature}/merge", body, format="json")
    assert_problem(response, 422, error_pointers=[pointer])


def test_merge_with_an_idempotency_key_replays(api, feature):
    put(api, "a", {"n": 2}, branch=feature)
    url = f"{BRANCHES}/{feature}/merge"
    first = api.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY="m1")
    again = api.post(url, {}, format="json", HTTP_IDEMPOTENCY_KEY="m1")
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert Changeset.objects.filter(rpc="MergeBranch").count() == 1


def test_abandon_endpoint(api, feature):
    put(api, "a", {"n": 2}, branch=feature)
    response = api.delete(f"{BRANCHES}/{feature}")
    assert response.status_code == 200
    assert response.json()["status"] == "abandoned" and response.json()["closed_at"]
    assert_problem(put(api, "a", {"n": 3}, branch=feature), 409)
    # The branch's changesets stay in the log.
    assert len(api.get(f"{API}/changesets", {"branch": feature}).json()["results"]) == 1
    assert api.get(entity_url("a"), **on(feature)).json()["content"] == {"n": 1}


def test_revert_under_the_header_is_staged_on_the_branch(api, feature, write, wendy):
    if not any(p.name == "changeset-revert" for p in _url_patterns()):
        pytest.skip("POST /changesets/{id}/revert is not served yet")
    landed = write(wendy, f"{NS}/order/a", {"n": 2}).changeset

    response = api.post(f"{API}/changesets/{landed.id}/revert", {}, format="json", **on(feature))

    assert response.status_code == 200, response.content
    staged = response.json()["changeset"]
    assert staged["branch"] == feature and staged["rpc"] == "RevertChangeset"
    assert api.get(entity_url("a"), **on(feature)).json()["content"] == {"n": 1}
    assert api.get(entity_url("a")).json()["content"] == {"n": 2}  # baseline unchanged
    merged = api.post(f"{BRANCHES}/{feature}/merge", {}, format="json")
    assert merged.status_code == 200, merged.content
    assert api.get(entity_url("a")).json()["content"] == {"n": 1}


def _url_patterns() -> list[Any]:
    from changesets.api import urls

    return list(urls.urlpatterns)


def test_schema_documents_the_branch_endpoints(client):
    schema = yaml.safe_load(client.get("/api/schema/").content)
    paths = schema["paths"]
    assert {"get", "post"} <= set(paths["/api/v1/branches"])
    assert {"get", "delete"} <= set(paths["/api/v1/branches/{name}"])
    assert "get" in paths["/api/v1/branches/{name}/diff"]
    assert "post" in paths["/api/v1/branches/{name}/merge"]


def test_history_of_a_key_the_branch_never_wrote_is_404_under_the_header(api, feature):
    assert api.get(f"{entity_url('a')}/history").status_code == 200
    assert_problem(api.get(f"{entity_url('a')}/history", **on(feature)), 404)


def test_as_of_reads_are_baseline_only(api, feature, write, wendy):
    landed = write(wendy, f"{NS}/order/a", {"n": 2}).changeset
    assert api.get(entity_url("a"), {"as_of": str(landed.id)}).status_code == 200
    assert_problem(api.get(entity_url("a"), {"as_of": str(landed.id)}, **on(feature)), 400)


def test_admin_browses_branches_read_only(admin_client, api, feature):
    put(api, "a", {"n": 2}, branch=feature)
    for model in ("branch", "branchentity"):
        assert admin_client.get(f"/admin/branches/{model}/").status_code == 200
    branch = Branch.objects.get(name=feature)
    detail = admin_client.get(f"/admin/branches/branch/{branch.pk}/change/")
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    assert admin_client.post(f"/admin/branches/branch/{branch.pk}/delete/").status_code == 403
