"""The trash: ``GET /entities?deleted=true``.

API.md "Restore and key-level merge (added)": entities whose newest revision
is a delete, each with ``deleted_by`` ``{changeset_id, author, at}`` and
``last_version`` (the version the delete removed); restore brings one back.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from branches.services import branch_create
from changesets.models import Changeset, Rpc
from changesets.ops import DeleteOp, PutOp
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.atlas.test_errors import assert_problem
from tests.changesets.test_admin import logged_in, make_admin

pytestmark = pytest.mark.django_db

API = "/api/v1"
NS = "acme.orders"
OTHER = "acme.secret"


def write(actor: Any, *ops: Any) -> Changeset:
    result = changeset_apply(store=baseline, actor=actor, ops=list(ops), rpc=Rpc.BATCH_MUTATE)
    assert result.changeset is not None
    return result.changeset


def k(path: str) -> EntityKey:
    return EntityKey(*path.split("/"))


def trash(client: Any, **params: Any) -> Any:
    return client.get(f"{API}/entities", {"deleted": "true", **params})


@pytest.fixture
def seeded(make_user):
    """Two deleted orders, one deleted and re-created, one live; a deleted secret."""
    alice = make_user("alice", writer=[NS, OTHER])
    write(alice, PutOp(k(f"{NS}/order/a"), {"v": 1}), PutOp(k(f"{NS}/order/b"), {"v": 1}))
    write(alice, PutOp(k(f"{NS}/order/a"), {"v": 2}), PutOp(k(f"{NS}/invoice/i"), {"v": 1}))
    write(alice, PutOp(k(f"{NS}/order/live"), {"v": 1}), PutOp(k(f"{OTHER}/x/s"), {"v": 1}))
    deleting = write(alice, DeleteOp(k(f"{NS}/order/a")), DeleteOp(k(f"{NS}/invoice/i")))
    write(alice, DeleteOp(k(f"{NS}/order/b")), DeleteOp(k(f"{OTHER}/x/s")))
    write(alice, PutOp(k(f"{NS}/order/b"), {"back": True}))  # re-created: not in the trash
    return {"alice": alice, "deleting": deleting}


def test_the_trash_lists_keys_whose_newest_revision_is_a_delete(seeded, client_for):
    response = trash(client_for(seeded["alice"]), namespace=NS)
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [(r["kind"], r["slug"]) for r in results] == [("invoice", "i"), ("order", "a")]
    a = results[1]
    deleting = seeded["deleting"]
    assert a["content"] == {"v": 2} and a["last_version"] == 2
    assert a["deleted_by"]["changeset_id"] == str(deleting.id)
    assert a["deleted_by"]["author"] == "alice"
    assert a["deleted_by"]["at"].startswith(deleting.at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert response.json()["next_page_token"] is None


def test_the_trash_filters_by_kind_and_slug_prefix(seeded, client_for):
    client = client_for(seeded["alice"])
    assert [r["slug"] for r in trash(client, namespace=NS, kind="order").json()["results"]] == ["a"]
    assert [r["slug"] for r in trash(client, slug_prefix="i").json()["results"]] == ["i"]


def test_the_trash_shows_only_readable_namespaces(seeded, make_user, client_for):
    rita = make_user("rita", reader=[NS])
    everything = trash(client_for(rita)).json()["results"]
    assert {r["namespace"] for r in everything} == {NS}
    assert trash(client_for(seeded["alice"])).json()["results"][-1]["namespace"] == OTHER


def test_the_trash_pages_with_tokens(seeded, client_for):
    client = client_for(seeded["alice"])
    first = trash(client, page_size=2).json()
    assert len(first["results"]) == 2 and first["next_page_token"]
    second = trash(client, page_size=2, page_token=first["next_page_token"]).json()
    assert [r["slug"] for r in second["results"]] == ["s"] and second["next_page_token"] is None
    other = trash(client, namespace=NS, page_size=2, page_token=first["next_page_token"])
    assert_problem(other, 400, pointer="/page_token")


def test_restore_takes_an_entity_out_of_the_trash(seeded, client_for):
    client = client_for(seeded["alice"])
    entry = trash(client, namespace=NS, kind="order").json()["results"][0]
    restored = client.post(
        f"{API}/entities/{NS}/order/a/restore", {"version": entry["last_version"]}, format="json"
    )
    assert restored.status_code == 201, restored.content
    assert restored.json()["entity"]["content"] == {"v": 2}
    assert trash(client, namespace=NS, kind="order").json()["results"] == []


def test_bad_trash_requests(seeded, client_for):
    client = client_for(seeded["alice"])
    branch_create(name="feature", actor=seeded["alice"])
    assert_problem(
        client.get(f"{API}/entities", {"deleted": "true"}, HTTP_X_ATLAS_BRANCH="feature"),
        400,
        pointer="/headers/X-Atlas-Branch",
    )
    head = Changeset.objects.order_by("-seq").first()
    assert_problem(trash(client, as_of=str(head.id)), 422, pointer="/as_of")
    assert_problem(client.get(f"{API}/entities", {"deleted": "maybe"}), 422)


def test_deleted_false_is_the_live_list(seeded, client_for):
    live = client_for(seeded["alice"]).get(f"{API}/entities", {"deleted": "false", "namespace": NS})
    assert [r["slug"] for r in live.json()["results"]] == ["b", "live"]


def test_a_trash_page_costs_the_same_queries_however_many_entries(
    make_user, client_for, django_assert_max_num_queries
):
    alice = make_user("alice", writer=[NS])
    client = client_for(alice)
    for n in (3, 60):
        ops = [PutOp(k(f"{NS}/t{n}/s{i:03}"), {"i": i}) for i in range(n)]
        write(alice, *ops)
        write(alice, *[DeleteOp(op.key) for op in ops])
        with django_assert_max_num_queries(8):
            page = trash(client, kind=f"t{n}", page_size=50).json()
        assert len(page["results"]) == min(n, 50)


def test_the_trash_walk_is_planned_once_per_connection(seeded, client_for):
    """The walk names every partition of the revision table: planned for each
    request, its planning grew with the log (2.4 ms at 13 partitions against 0.2 of
    running). Prepared, the connection plans it once and each page reuses that plan."""
    from django.db import connection

    client = client_for(seeded["alice"])
    for _ in range(3):
        assert trash(client, namespace=NS).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            ["%DISTINCT ON (namespace, kind, slug)%op = 'delete'%"],
        )
        plans = cursor.fetchall()
    assert len(plans) == 1, plans  # one statement, prepared once
    generic, custom = plans[0]
    assert generic >= 3 and custom == 0, plans


def test_the_trash_walks_a_namespace_of_many_deletes_in_order_with_its_one_plan(
    make_user, client_for
):
    """The prepared walk's one plan serves every namespace, so it must not be one
    that suits a namespace of few deletes only: for one of thousands it still merges
    the partitions' ``revision_deletes`` in key order and stops at the page, instead
    of sorting every delete of the namespace."""
    from django.db import connection

    from changesets.selectors import restore
    from tests.changesets.partition_helpers import analyze_generic
    from tests.changesets.test_time_seek import nodes

    alice = make_user("alice", writer=[NS, OTHER])
    for batch in range(3):
        keys = [k(f"{NS}/bulk/b{batch}-{i:04}") for i in range(1000)]
        write(alice, *[PutOp(key, {"i": 1}) for key in keys])
        write(alice, *[DeleteOp(key) for key in keys])
    write(alice, PutOp(k(f"{OTHER}/x/s"), {"v": 1}))
    write(alice, DeleteOp(k(f"{OTHER}/x/s")))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE changesets_revision")
    seen: list[tuple[str, list]] = []

    def record(execute, sql, params, many, context):
        if "op = 'delete'" in sql:
            seen.append((sql, list(params)))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        page = trash(client_for(alice), namespace=NS, page_size=50).json()
    assert len(page["results"]) == 50 and seen
    sql, params = seen[0]
    assert restore._DELETED.split("{")[0] in sql
    plan = analyze_generic(sql, params)
    for node in nodes(plan):
        if node["Node Type"] in ("Sort", "Incremental Sort") and node is not plan:
            assert node.get("Actual Rows", 0) <= 2 * 82, node  # the walk's batch, not 3,000
        if "Scan" in node["Node Type"]:
            assert node.get("Actual Rows", 0) <= 2 * 82, node


# --- the admin's "Deleted" view and its restore button -----------------------------


def admin_trash(namespace: str) -> str:
    return reverse("admin:changesets_revision_deleted", args=[namespace])


def admin_restore(path: str) -> str:
    return reverse("admin:changesets_revision_restore", args=path.split("/"))


def test_the_admin_trash_lists_deleted_entities_with_a_restore_button_for_writers(seeded):
    page = logged_in(make_admin("wanda", writer=[NS])).get(admin_trash(NS))
    assert page.status_code == 200
    html = page.content.decode()
    assert f"{NS}/order/a" in html and f"{NS}/invoice/i" in html
    assert f"{NS}/order/b" not in html and f"{NS}/order/live" not in html
    assert html.count("atlas-restore-button") == 2
    index = logged_in(make_admin("wanda2", writer=[NS])).get(
        reverse("admin:changesets_revision_deleted_index")
    )
    assert admin_trash(NS) in index.content.decode()
    assert admin_trash(OTHER) not in index.content.decode()


def test_a_reader_sees_the_trash_but_no_button_and_cannot_restore(seeded):
    client = logged_in(make_admin("rhea", reader=[NS]))
    html = client.get(admin_trash(NS)).content.decode()
    assert f"{NS}/order/a" in html and "atlas-restore-button" not in html
    assert client.get(admin_restore(f"{NS}/order/a")).status_code == 403
    assert client.get(admin_trash(OTHER)).status_code == 404


def test_preview_writes_nothing_and_confirm_re_creates_with_the_signed_plan(seeded):
    client = logged_in(make_admin("wanda", writer=[NS]))
    count = Changeset.objects.count()
    preview = client.get(admin_restore(f"{NS}/order/a"))
    assert preview.status_code == 200 and Changeset.objects.count() == count
    token = re.search(r'name="plan" value="([^"]+)"', preview.content.decode()).group(1)
    done = client.post(admin_restore(f"{NS}/order/a"), {"plan": token, "comment": "oops"})
    assert done.status_code == 302
    restored = Changeset.objects.order_by("-seq").first()
    assert restored.rpc == Rpc.RESTORE_ENTITY and restored.author_name == "wanda"
    assert restored.comment == "oops"
    assert baseline.get(k(f"{NS}/order/a")).content == {"v": 2}


def test_confirm_refuses_a_missing_token_and_a_plan_that_moved_on(seeded):
    wanda = make_admin("wanda", writer=[NS])
    client = logged_in(wanda)
    count = Changeset.objects.count()
    assert client.post(admin_restore(f"{NS}/order/a"), {"plan": "forged"}).status_code == 302
    assert Changeset.objects.count() == count
    preview = client.get(admin_restore(f"{NS}/order/a")).content.decode()
    token = re.search(r'name="plan" value="([^"]+)"', preview).group(1)
    # Re-created and deleted again meanwhile: another delete, another plan.
    write(wanda, PutOp(k(f"{NS}/order/a"), {"v": "other"}))
    write(wanda, DeleteOp(k(f"{NS}/order/a")))
    count = Changeset.objects.count()
    response = client.post(admin_restore(f"{NS}/order/a"), {"plan": token}, follow=True)
    assert "nothing was restored" in response.content.decode()
    assert Changeset.objects.count() == count and baseline.get(k(f"{NS}/order/a")) is None


def test_a_long_run_of_re_created_keys_is_walked_past(make_user, client_for):
    alice = make_user("alice", writer=[NS])
    ops = [PutOp(k(f"{NS}/r/s{i:03}"), {"i": i}) for i in range(120)]
    write(alice, *ops)
    write(alice, *[DeleteOp(op.key) for op in ops])
    write(alice, *ops[:110])  # back again: their deletes are no longer their newest revision
    page = trash(client_for(alice), kind="r", page_size=5).json()
    assert [r["slug"] for r in page["results"]] == [f"s{i:03}" for i in range(110, 115)]
    rest = trash(client_for(alice), kind="r", page_token=page["next_page_token"]).json()
    assert [r["slug"] for r in rest["results"]] == [f"s{i:03}" for i in range(115, 120)]
