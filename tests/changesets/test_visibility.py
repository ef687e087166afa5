"""Bounded changeset representations and what each reader sees of them.

API.md "Limits and visibility (added)" and its decisions: ``GET
/changesets/{id}`` pages its ops (``page_size`` default 100, max 500,
``ops_next_page_token``), ``/revisions`` pages like every list, a list page
embeds at most 100 ops per changeset with ``ops_truncated``; a changeset
spanning namespaces shows ``op_count_visible`` to everyone and ``op_count``,
``message`` and ``comment`` only to readers of all of them (absent, not null).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from atlas.api import paging
from changesets.models import Changeset, Revision, Rpc
from changesets.ops import PutOp
from changesets.services.apply import changeset_apply
from entities.store import baseline
from tests.atlas.test_errors import assert_problem
from tests.changesets.helpers import assert_nothing_written, key, log_snapshot
from tests.entities.factories import NamespaceFactory, UserFactory

API = "/api/v1"
NS = "acme.orders"
NS2 = "acme.billing"
HIDDEN = ("op_count", "message", "comment")


@pytest.fixture
def root(db):
    return UserFactory(username="root", is_superuser=True, is_staff=True)


@pytest.fixture
def namespaces(db):
    return NamespaceFactory(name=NS), NamespaceFactory(name=NS2)


def write_batch(actor: Any, paths: list[str], *, comment: str = "") -> Changeset:
    ops = [PutOp(key(p), {"n": i}) for i, p in enumerate(paths)]
    result = changeset_apply(
        store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE, comment=comment
    )
    assert result.changeset is not None
    return result.changeset


def slugs(ops: list[dict[str, Any]]) -> list[str]:
    return [o["slug"] for o in ops]


@pytest.fixture
def mixed(root, namespaces) -> Changeset:
    """One changeset: three ops in NS interleaved with two in NS2, with a comment."""
    return write_batch(
        root,
        [f"{NS}/o/a", f"{NS2}/i/x", f"{NS}/o/b", f"{NS2}/i/y", f"{NS}/o/c"],
        comment="move money",
    )


@pytest.fixture
def partial(make_user, client_for, namespaces):
    """A reader of NS only."""
    return client_for(make_user("paula", reader=[NS]))


@pytest.fixture
def whole(make_user, client_for, namespaces):
    """A reader of both namespaces (no superuser powers)."""
    return client_for(make_user("walt", reader=[NS, NS2]))


def walk(client: Any, url: str, params: dict[str, Any], items: str, token: str) -> list[Any]:
    """Every page of ``url``: the concatenated ``items``, following ``token``."""
    seen: list[Any] = []
    params = dict(params)
    while True:
        response = client.get(url, params)
        assert response.status_code == 200, response.content
        body = response.json()
        seen.append(body[items])
        if body[token] is None:
            return seen
        params["page_token"] = body[token]


# --- one changeset: its ops are paged ---------------------------------------------------


def test_one_changeset_pages_its_ops_in_op_order(client_for, root, namespaces):
    paths = [f"{NS}/o/{s}" for s in ("e", "b", "d", "a", "c")]
    cs = write_batch(root, paths)
    pages = walk(
        client_for(root),
        f"{API}/changesets/{cs.id}",
        {"page_size": 2},
        "ops",
        "ops_next_page_token",
    )
    assert [slugs(p) for p in pages] == [["e", "b"], ["d", "a"], ["c"]]
    whole_page = client_for(root).get(f"{API}/changesets/{cs.id}").json()
    assert whole_page["ops_next_page_token"] is None
    assert whole_page["op_count"] == whole_page["op_count_visible"] == 5
    assert slugs(whole_page["ops"]) == ["e", "b", "d", "a", "c"]


def test_one_changeset_shows_100_ops_by_default_and_at_most_500(
    client_for, root, namespaces, monkeypatch
):
    cs = write_batch(root, [f"{NS}/o/e{i:03d}" for i in range(150)])
    api = client_for(root)
    first = api.get(f"{API}/changesets/{cs.id}").json()
    assert len(first["ops"]) == 100 and first["op_count"] == 150
    assert first["ops_next_page_token"]
    rest = api.get(f"{API}/changesets/{cs.id}", {"page_token": first["ops_next_page_token"]})
    assert len(rest.json()["ops"]) == 50 and rest.json()["ops_next_page_token"] is None
    assert slugs(first["ops"]) + slugs(rest.json()["ops"]) == [f"e{i:03d}" for i in range(150)]
    # The clamp, without writing 501 ops: lower the maximum.
    monkeypatch.setattr(paging, "MAX_PAGE_SIZE", 120)
    clamped = api.get(f"{API}/changesets/{cs.id}", {"page_size": 1000}).json()
    assert len(clamped["ops"]) == 120 and clamped["ops_next_page_token"]


@pytest.mark.parametrize("size", ["0", "-1", "abc"])
def test_a_bad_ops_page_size_is_422(client_for, root, mixed, size):
    response = client_for(root).get(f"{API}/changesets/{mixed.id}", {"page_size": size})
    assert_problem(response, 422, error_pointers=["/page_size"])


def test_an_unknown_query_parameter_on_one_changeset_is_422(client_for, root, mixed):
    response = client_for(root).get(f"{API}/changesets/{mixed.id}", {"pagesize": 2})
    assert_problem(response, 422, error_pointers=["/pagesize"])


def test_an_ops_page_token_is_bound_to_its_changeset_listing_and_user(
    client_for, root, whole, namespaces
):
    one = write_batch(root, [f"{NS}/o/a", f"{NS}/o/b", f"{NS}/o/c"])
    other = write_batch(root, [f"{NS}/o/d", f"{NS}/o/e", f"{NS}/o/f"])
    api = client_for(root)
    token = api.get(f"{API}/changesets/{one.id}", {"page_size": 1}).json()["ops_next_page_token"]
    revisions_token = api.get(f"{API}/changesets/{one.id}/revisions", {"page_size": 1}).json()[
        "next_page_token"
    ]
    for url, bad in [
        (f"{API}/changesets/{other.id}", token),  # another changeset
        (f"{API}/changesets/{one.id}", revisions_token),  # another listing
        (f"{API}/changesets/{one.id}", token[:-2] + ("AA" if token[-2:] != "AA" else "BB")),
        (f"{API}/changesets/{one.id}", "garbage"),
    ]:
        assert_problem(api.get(url, {"page_token": bad}), 400, pointer="/page_token")
    # another user
    assert_problem(whole.get(f"{API}/changesets/{one.id}", {"page_token": token}), 400)


# --- revisions are paged ----------------------------------------------------------------


def test_revisions_page_in_op_order(client_for, root, namespaces):
    paths = [f"{NS}/o/{s}" for s in ("e", "b", "d", "a", "c")]
    cs = write_batch(root, paths)
    pages = walk(
        client_for(root),
        f"{API}/changesets/{cs.id}/revisions",
        {"page_size": 2},
        "results",
        "next_page_token",
    )
    assert [[r["slug"] for r in p] for p in pages] == [["e", "b"], ["d", "a"], ["c"]]
    assert pages[0][0]["after"] == {"n": 0}


def test_revisions_default_to_pages_of_50(client_for, root, namespaces):
    cs = write_batch(root, [f"{NS}/o/e{i:02d}" for i in range(51)])
    body = client_for(root).get(f"{API}/changesets/{cs.id}/revisions").json()
    assert len(body["results"]) == paging.DEFAULT_PAGE_SIZE == 50
    assert body["next_page_token"]


def test_a_revisions_token_of_another_changeset_is_400(client_for, root, namespaces):
    one = write_batch(root, [f"{NS}/o/a", f"{NS}/o/b"])
    other = write_batch(root, [f"{NS}/o/c", f"{NS}/o/d"])
    api = client_for(root)
    token = api.get(f"{API}/changesets/{one.id}/revisions", {"page_size": 1}).json()[
        "next_page_token"
    ]
    response = api.get(f"{API}/changesets/{other.id}/revisions", {"page_token": token})
    assert_problem(response, 400, pointer="/page_token")


def test_a_partial_reader_pages_only_its_revisions(partial, mixed):
    pages = walk(
        partial,
        f"{API}/changesets/{mixed.id}/revisions",
        {"page_size": 2},
        "results",
        "next_page_token",
    )
    assert [[r["slug"] for r in p] for p in pages] == [["a", "b"], ["c"]]


# --- list pages embed at most 100 ops --------------------------------------------------


def test_a_list_page_embeds_the_first_100_ops_and_says_it_cut(client_for, root, namespaces):
    big = write_batch(root, [f"{NS}/o/e{i:03d}" for i in range(101)])
    small = write_batch(root, [f"{NS}/o/s"])
    results = client_for(root).get(f"{API}/changesets").json()["results"]
    assert [c["id"] for c in results] == [str(small.id), str(big.id)]
    s, b = results
    assert (s["ops_truncated"], len(s["ops"]), s["op_count_visible"]) == (False, 1, 1)
    assert (b["ops_truncated"], len(b["ops"]), b["op_count"], b["op_count_visible"]) == (
        True,
        100,
        101,
        101,
    )
    assert slugs(b["ops"]) == [f"e{i:03d}" for i in range(100)]


def test_exactly_100_ops_are_not_truncated(client_for, root, namespaces):
    write_batch(root, [f"{NS}/o/e{i:03d}" for i in range(100)])
    (listed,) = client_for(root).get(f"{API}/changesets").json()["results"]
    assert len(listed["ops"]) == 100 and listed["ops_truncated"] is False


def test_a_list_page_costs_the_same_queries_however_many_ops_its_changesets_hold(
    client_for, root, namespaces, partial, django_assert_max_num_queries
):
    for n in range(3):
        write_batch(root, [f"{NS}/o/a{n}-{i:03d}" for i in range(120)] + [f"{NS2}/i/x{n}"])
    # auth + roles + the log head (where the merged page starts: bounds.newest_in_window)
    # + the page + its first ops + the partial readers' counts
    with django_assert_max_num_queries(6):
        results = partial.get(f"{API}/changesets").json()["results"]
    assert [(len(c["ops"]), c["ops_truncated"], c["op_count_visible"]) for c in results] == [
        (100, True, 120)
    ] * 3


# --- per-reader fields -----------------------------------------------------------------


def test_a_partial_reader_sees_its_count_and_not_the_whole(partial, mixed):
    body = partial.get(f"{API}/changesets/{mixed.id}").json()
    assert slugs(body["ops"]) == ["a", "b", "c"]
    assert body["op_count_visible"] == 3
    for name in HIDDEN:
        assert name not in body, name  # absent, not null
    assert body["ops_next_page_token"] is None


def test_a_partial_reader_pages_only_visible_ops(partial, mixed):
    pages = walk(
        partial, f"{API}/changesets/{mixed.id}", {"page_size": 2}, "ops", "ops_next_page_token"
    )
    assert [slugs(p) for p in pages] == [["a", "b"], ["c"]]


def test_a_partial_reader_list_entry_hides_the_same_fields(partial, mixed):
    (listed,) = partial.get(f"{API}/changesets").json()["results"]
    assert listed["id"] == str(mixed.id)
    assert (listed["op_count_visible"], listed["ops_truncated"]) == (3, False)
    assert slugs(listed["ops"]) == ["a", "b", "c"]
    for name in HIDDEN:
        assert name not in listed, name


def test_ops_truncated_counts_what_the_reader_may_see(client_for, root, partial, namespaces):
    """100 visible ops and 5 hidden ones: nothing the reader may see was cut."""
    write_batch(
        root, [f"{NS}/o/e{i:03d}" for i in range(100)] + [f"{NS2}/i/x{i}" for i in range(5)]
    )
    (listed,) = partial.get(f"{API}/changesets").json()["results"]
    assert (listed["op_count_visible"], listed["ops_truncated"], len(listed["ops"])) == (
        100,
        False,
        100,
    )
    (seen_whole,) = client_for(root).get(f"{API}/changesets").json()["results"]
    assert (seen_whole["op_count"], seen_whole["ops_truncated"]) == (105, True)


def test_a_reader_of_every_namespace_sees_everything(whole, mixed):
    """A role grant on each namespace, no superuser powers, is enough."""
    body = whole.get(f"{API}/changesets/{mixed.id}").json()
    assert (body["op_count"], body["op_count_visible"]) == (5, 5)
    assert body["message"] == "BatchMutate: 5 change(s)"
    assert body["comment"] == "move money"
    assert slugs(body["ops"]) == ["a", "x", "b", "y", "c"]
    (listed,) = whole.get(f"{API}/changesets").json()["results"]
    assert {k: v for k, v in listed.items() if k != "ops_truncated"} == {
        k: v for k, v in body.items() if k != "ops_next_page_token"
    }


def test_a_partial_reader_export_blanks_the_comment(partial, whole, mixed):
    text = b"".join(partial.get(f"{API}/changesets/{mixed.id}/export").streaming_content)
    envelope, *ops = (json.loads(line) for line in text.decode().splitlines())
    assert envelope["comment"] == ""
    assert [o["slug"] for o in ops] == ["a", "b", "c"]
    text = b"".join(whole.get(f"{API}/changesets/{mixed.id}/export").streaming_content)
    assert json.loads(text.decode().splitlines()[0])["comment"] == "move money"


# --- revert of partly hidden changesets ------------------------------------------------


@pytest.mark.parametrize("body", [{}, {"dry_run": True}, {"bogus": 1}, {"comment": 5}], ids=repr)
def test_revert_by_a_writer_who_cannot_read_every_namespace_is_404_like_a_missing_one(
    make_user, client_for, mixed, body
):
    """Whatever the body: a 422 for a bad one would tell a hidden op from a missing id."""
    writer = client_for(make_user("wanda", writer=[NS]))
    snapshot = log_snapshot()
    hidden = assert_problem(
        writer.post(f"{API}/changesets/{mixed.id}/revert", body, format="json"), 404
    )
    missing = assert_problem(
        writer.post(f"{API}/changesets/{uuid.uuid4()}/revert", body, format="json"), 404
    )
    assert hidden["detail"] == missing["detail"] and hidden["title"] == missing["title"]
    assert_nothing_written(snapshot)


def test_revert_by_a_writer_who_reads_every_namespace_is_judged_on_write_rights(
    make_user, client_for, mixed
):
    """Can see it all, cannot write NS2: 403 (it is visible, so not hidden)."""
    writer = client_for(make_user("wilma", writer=[NS], reader=[NS2]))
    assert_problem(writer.post(f"{API}/changesets/{mixed.id}/revert", {}, format="json"), 403)


def test_a_revert_response_shows_the_new_changeset_whole(client_for, make_user, mixed, root):
    writer = client_for(make_user("wade", writer=[NS, NS2]))
    response = writer.post(f"{API}/changesets/{mixed.id}/revert", {}, format="json")
    assert response.status_code == 200, response.content
    changeset = response.json()["changeset"]
    assert (changeset["op_count"], changeset["op_count_visible"]) == (5, 5)
    assert changeset["message"] == "RevertChangeset: 5 change(s)"
    assert Revision.objects.filter(changeset_id=changeset["id"]).count() == 5
