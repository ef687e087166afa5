"""The pull change feed: records, capture modes, pages, cursors, watermark, visibility."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import uuid6
from django.utils import timezone

from changesets.models import Changeset, Revision, Rpc
from changesets.ops import DeleteOp, PutOp
from changesets.selectors import feed, feed_values
from changesets.services.apply import changeset_apply
from entities.store import baseline
from tests.changesets.helpers import key
from tests.entities.factories import NamespaceFactory

pytestmark = pytest.mark.django_db

API = "/api/v1/changes"
NS = "acme.orders"
RECORD_FIELDS = {
    "event_id",
    "changeset_id",
    "seq",
    "at",
    "author",
    "rpc",
    "op",
    "namespace",
    "kind",
    "slug",
    "version",
    "changed",
    "metadata",
    "context",
}


@pytest.fixture
def api(staff, client_for):
    return client_for(staff)


def get_page(client, **params: Any) -> dict[str, Any]:
    response = client.get(API, params)
    assert response.status_code == 200, response.content
    return response.json()


def batch(actor, *ops, rpc=Rpc.BATCH_MUTATE):
    return changeset_apply(store=baseline, actor=actor, ops=list(ops), rpc=rpc).changeset


def branch_changeset(actor, path: str, content: dict) -> Changeset:
    """A committed branch changeset, written as the log's rows (the feed must ignore it)."""
    from changesets.models import LogHead

    head = LogHead.objects.get_or_create(id=1)[0]
    LogHead.objects.filter(id=1).update(seq=head.seq + 1)
    k = key(path)
    changeset = Changeset(
        id=uuid6.uuid7(),
        seq=head.seq + 1,
        author=actor,
        author_name=actor.username,
        at=timezone.now(),
        message="PutEntity: 1 change(s)",
        branch="feature",
        rpc=Rpc.PUT_ENTITY,
        op_count=1,
        namespaces=[k.namespace],
    )
    changeset.save(force_insert=True)
    Revision(
        changeset_id=changeset.id,
        seq=changeset.seq,
        at=changeset.at,
        branch="feature",
        namespace=k.namespace,
        kind=k.kind,
        slug=k.slug,
        op="create",
        after=content,
        after_version=1,
    ).save(force_insert=True)
    return changeset


# --- records and capture modes -----------------------------------------------------------


def test_a_record_per_revision_with_the_contract_fields(api, staff, namespace, write):
    changeset = write(staff, f"{NS}/order/a", {"title": "A"}).changeset

    page = get_page(api)

    assert page["capture"] == "new_values"
    [record] = page["records"]
    assert set(record) == RECORD_FIELDS | {"new_values"}
    assert record["event_id"] == f"{changeset.id}:{NS}/order/a"
    assert record["changeset_id"] == str(changeset.id)
    assert record["seq"] == changeset.seq
    assert record["author"] == staff.username
    assert record["rpc"] == "PutEntity"
    assert record["op"] == "create"
    assert (record["namespace"], record["kind"], record["slug"]) == (NS, "order", "a")
    assert record["version"] == 1
    assert record["at"].endswith("Z")
    assert page["watermark"] == {
        "seq": changeset.seq,
        "changeset_id": str(changeset.id),
        "at": record["at"],
    }


def _history(staff, write) -> None:
    write(staff, f"{NS}/order/a", {"keep": 1, "change": "old", "drop": True})
    write(staff, f"{NS}/order/a", {"keep": 1, "change": "new", "add": [1]})
    write(staff, f"{NS}/order/a", None)


def test_new_values_are_the_changed_keys_and_removed_keys_map_to_null(api, staff, namespace, write):
    _history(staff, write)

    create, update, delete = get_page(api)["records"]

    assert create["new_values"] == {"keep": 1, "change": "old", "drop": True}
    assert update["new_values"] == {"change": "new", "add": [1], "drop": None}
    # A delete maps every key of the before image to null, and has no version.
    assert delete["op"] == "delete"
    assert delete["new_values"] == {"keep": None, "change": None, "add": None}
    assert delete["version"] is None
    assert [r["version"] for r in (create, update)] == [1, 2]


def test_new_row_is_the_whole_after_image(api, staff, namespace, write):
    _history(staff, write)

    records = get_page(api, capture="new_row")["records"]

    assert [r["new_row"] for r in records] == [
        {"keep": 1, "change": "old", "drop": True},
        {"keep": 1, "change": "new", "add": [1]},
        None,
    ]
    assert all("new_values" not in r and "old_values" not in r for r in records)


def test_old_and_new_values(api, staff, namespace, write):
    _history(staff, write)

    page = get_page(api, capture="old_and_new_values")
    create, update, delete = page["records"]

    assert page["capture"] == "old_and_new_values"
    assert create["old_values"] == {}  # nothing existed before
    assert create["new_values"] == {"keep": 1, "change": "old", "drop": True}
    # A key that did not exist before ("add") is absent from old_values.
    assert update["old_values"] == {"change": "old", "drop": True}
    assert update["new_values"] == {"change": "new", "add": [1], "drop": None}
    assert delete["old_values"] == {"keep": 1, "change": "new", "add": [1]}
    assert delete["new_values"] == {"keep": None, "change": None, "add": None}


def test_values_compare_as_json_not_as_python(api, staff, namespace, write):
    write(staff, f"{NS}/order/a", {"n": 1, "b": True})
    write(staff, f"{NS}/order/a", {"n": 1.5, "b": 1})

    update = get_page(api, capture="old_and_new_values")["records"][1]

    assert update["old_values"] == {"n": 1, "b": True}
    assert update["new_values"] == {"n": 1.5, "b": 1}
    assert update["new_values"]["b"] is not True


def test_changed_values_unit():
    assert feed_values.changed_values(None, {"a": 1}) == ({}, {"a": 1})
    assert feed_values.changed_values({"a": 1}, None) == ({"a": 1}, {"a": None})
    assert feed_values.changed_values({"a": 1, "b": 2}, {"a": 1, "b": 3}) == ({"b": 2}, {"b": 3})
    assert feed_values.changed_values({"a": {"x": 1}}, {"a": {"x": 1}}) == ({}, {})


@pytest.mark.parametrize("capture", ["", "everything", "NEW_ROW"])
def test_unknown_capture_is_422(api, db, capture):
    if capture == "":
        assert api.get(API, {"capture": ""}).status_code == 200  # empty = default
        return
    response = api.get(API, {"capture": capture})
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/capture"


# --- order, pages, cursors ------------------------------------------------------------------


def test_records_follow_seq_then_write_order(api, staff, namespace, write):
    first = batch(
        staff,
        PutOp(key(f"{NS}/order/z"), {"n": 1}),
        PutOp(key(f"{NS}/order/a"), {"n": 1}),
        PutOp(key(f"{NS}/order/m"), {"n": 1}),
    )
    second = write(staff, f"{NS}/order/b", {"n": 1}).changeset

    records = get_page(api)["records"]

    assert [(r["seq"], r["slug"]) for r in records] == [
        (first.seq, "z"),
        (first.seq, "a"),
        (first.seq, "m"),
        (second.seq, "b"),
    ]


def test_pages_end_on_changeset_boundaries(api, staff, namespace, write):
    one = batch(staff, *[PutOp(key(f"{NS}/order/a{i}"), {"i": i}) for i in range(3)])
    two = batch(staff, *[PutOp(key(f"{NS}/order/b{i}"), {"i": i}) for i in range(4)])
    three = write(staff, f"{NS}/order/c", {"i": 0}).changeset

    page1 = get_page(api, limit=2)  # the first changeset has 3 records: the page takes all 3
    page2 = get_page(api, limit=4, since=page1["next_cursor"])  # exactly one changeset
    page3 = get_page(api, limit=1, since=page2["next_cursor"])
    page4 = get_page(api, limit=1, since=page3["next_cursor"])

    assert {r["seq"] for r in page1["records"]} == {one.seq}
    assert len(page1["records"]) == 3
    assert {r["seq"] for r in page2["records"]} == {two.seq}
    assert len(page2["records"]) == 4
    assert [r["seq"] for r in page3["records"]] == [three.seq]
    assert page4["records"] == []
    assert page4["next_cursor"] == page3["next_cursor"]


@pytest.mark.parametrize("width", [1, 2, 5, 1_000_000])
def test_pages_across_the_read_window_hold_every_record_once(
    api, staff, namespace, write, settings, width
):
    """A page is read first within a partition's width of seqs above the cursor,
    then above it (``feed.feed_page``): narrow widths put that edge inside pages,
    between changesets and past a branch changeset (which the feed skips)."""
    settings.ATLAS_LOG_PARTITION_SEQS = width
    for i in range(4):
        batch(staff, *[PutOp(key(f"{NS}/order/w{i}-{j}"), {"j": j}) for j in range(i + 1)])
        if i == 1:
            branch_changeset(staff, f"{NS}/order/b", {"n": i})
    expected = list(
        Revision.objects.filter(branch="").order_by("seq", "id").values_list("seq", "slug")
    )
    for limit in (1, 2, 3, 100):
        seen, cursor = [], None
        while True:
            page = get_page(api, limit=limit, **({"since": cursor} if cursor else {}))
            seen += [(r["seq"], r["slug"]) for r in page["records"]]
            if not page["records"]:
                break
            cursor = page["next_cursor"]
        assert seen == expected, (width, limit)


def test_a_page_can_hold_several_changesets_and_never_splits_one(api, staff, namespace, write):
    for i in range(5):
        batch(staff, PutOp(key(f"{NS}/order/x{i}"), {"i": i}), PutOp(key(f"{NS}/order/y{i}"), {}))

    page = get_page(api, limit=5)

    assert len(page["records"]) == 6  # 2 + 2 + 2: the third changeset is finished
    assert len({r["seq"] for r in page["records"]}) == 3


def test_empty_page_keeps_the_cursor_and_polling_resumes(api, staff, namespace, write):
    write(staff, f"{NS}/order/a", {"n": 1})
    first = get_page(api)
    empty = get_page(api, since=first["next_cursor"])
    assert empty["records"] == []
    assert empty["next_cursor"] == first["next_cursor"]

    changeset = write(staff, f"{NS}/order/a", {"n": 2}).changeset
    later = get_page(api, since=empty["next_cursor"])

    assert [r["changeset_id"] for r in later["records"]] == [str(changeset.id)]
    assert later["watermark"]["seq"] == changeset.seq


def test_first_page_of_an_empty_log_has_a_resumable_cursor(api, staff, namespace, write):
    page = get_page(api)
    assert page["records"] == []
    assert isinstance(page["next_cursor"], str) and page["next_cursor"]
    assert page["watermark"] == {"seq": 0, "changeset_id": None, "at": None}

    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    resumed = get_page(api, since=page["next_cursor"])

    assert [r["changeset_id"] for r in resumed["records"]] == [str(changeset.id)]


def test_cursors_are_stable_positions_usable_with_any_filter_or_capture(
    api, staff, namespace, write
):
    write(staff, f"{NS}/order/a", {"n": 1})
    cursor = get_page(api)["next_cursor"]
    second = write(staff, f"{NS}/order/b", {"n": 1}).changeset

    for params in ({"capture": "new_row"}, {"namespace": NS}, {"limit": 1}):
        records = get_page(api, since=cursor, **params)["records"]
        assert [r["changeset_id"] for r in records] == [str(second.id)]
    # The same position always encodes to the same string.
    assert feed.cursor_encode(7) == feed.cursor_encode(7)


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        "eyJzIjo1fQ:forged",
        "",  # handled below: empty means "from the beginning"
    ],
)
def test_tampered_cursor_is_400(api, staff, namespace, write, cursor):
    write(staff, f"{NS}/order/a", {"n": 1})
    if cursor == "":
        assert api.get(API, {"since": ""}).status_code == 200
        return
    response = api.get(API, {"since": cursor})
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["pointer"] == "/since"


def test_an_edited_cursor_is_400(api, staff, namespace, write):
    write(staff, f"{NS}/order/a", {"n": 1})
    cursor = get_page(api)["next_cursor"]
    payload, _, signature = cursor.rpartition(":")
    # Swap the payload for another position, keep the signature.
    forged = feed.cursor_encode(0).rpartition(":")[0] + ":" + signature
    assert forged != cursor

    assert api.get(API, {"since": forged}).status_code == 400
    assert (
        api.get(API, {"since": cursor[:-1] + ("A" if cursor[-1] != "A" else "B")}).status_code
        == 400
    )


def test_a_cursor_signed_for_something_else_is_400(api, db):
    from django.core import signing

    assert (
        api.get(API, {"since": signing.Signer(salt="other").sign_object({"s": 1})}).status_code
        == 400
    )
    assert api.get(API, {"since": feed._signer.sign_object({"s": -1})}).status_code == 400
    assert api.get(API, {"since": feed._signer.sign_object({"s": "1"})}).status_code == 400
    assert api.get(API, {"since": feed._signer.sign_object([1])}).status_code == 400


def test_cursor_from_the_future_yields_an_empty_page(api, staff, namespace, write):
    write(staff, f"{NS}/order/a", {"n": 1})
    future = feed.cursor_encode(10_000)
    page = get_page(api, since=future)
    assert page["records"] == [] and page["next_cursor"] == future


def test_limit_default_max_and_validation(api, staff, namespace, write):
    for i in range(3):
        write(staff, f"{NS}/order/a{i}", {"n": i})
    assert len(get_page(api, limit=1)["records"]) == 1
    assert api.get(API, {"limit": 0}).status_code == 422
    assert api.get(API, {"limit": "x"}).status_code == 422
    assert len(get_page(api, limit=5000)["records"]) == 3  # clamped to 1000, no error


def test_unknown_parameter_is_422(api, db):
    response = api.get(API, {"cursor": "x"})
    assert response.status_code == 422


def test_walk_reads_every_changeset_once_in_seq_order(api, staff, namespace, write):
    made = []
    for i in range(12):
        ops = [PutOp(key(f"{NS}/order/k{i}-{j}"), {"i": i}) for j in range(1 + i % 3)]
        made.append(batch(staff, *ops))
    seen: list[tuple[int, str]] = []
    cursor = None
    while True:
        params = {"limit": 2} if cursor is None else {"limit": 2, "since": cursor}
        page = get_page(api, **params)
        if not page["records"]:
            break
        seen.extend((r["seq"], r["changeset_id"]) for r in page["records"])
        cursor = page["next_cursor"]

    order = list(dict.fromkeys(seen))
    assert [cid for _, cid in order] == [str(c.id) for c in made]
    assert [s for s, _ in order] == sorted(s for s, _ in order)
    assert len(seen) == sum(c.op_count for c in made)


# --- baseline only, watermark ---------------------------------------------------------------


def test_branch_changesets_stay_out_of_the_feed_and_the_watermark(api, staff, namespace, write):
    baseline_cs = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    branch_changeset(staff, f"{NS}/order/b", {"n": 1})

    page = get_page(api)

    assert [r["changeset_id"] for r in page["records"]] == [str(baseline_cs.id)]
    assert page["watermark"]["changeset_id"] == str(baseline_cs.id)
    later = write(staff, f"{NS}/order/c", {"n": 1}).changeset
    assert [r["changeset_id"] for r in get_page(api, since=page["next_cursor"])["records"]] == [
        str(later.id)
    ]


@pytest.mark.parametrize("width", [1_000_000, 3, 1])
def test_the_watermark_is_found_below_a_window_of_branch_changesets(
    api, staff, namespace, write, settings, width
):
    """The watermark is sought first among a partition's width of seqs below the
    log head (``feed.watermark``); when those are all branch changesets it is
    found below them."""
    settings.ATLAS_LOG_PARTITION_SEQS = width
    baseline_cs = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    for i in range(4):
        branch_changeset(staff, f"{NS}/order/b{i}", {"n": i})
    assert get_page(api)["watermark"]["changeset_id"] == str(baseline_cs.id)
    later = write(staff, f"{NS}/order/c", {"n": 1}).changeset
    assert get_page(api)["watermark"]["changeset_id"] == str(later.id)


def test_watermark_ignores_the_namespace_filter(api, staff, namespace, write):
    NamespaceFactory(name="acme.billing")
    mine = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    other = write(staff, "acme.billing/invoice/i", {"n": 1}).changeset

    page = get_page(api, namespace=NS)

    assert [r["changeset_id"] for r in page["records"]] == [str(mine.id)]
    assert page["watermark"]["seq"] == other.seq
    assert page["watermark"]["changeset_id"] == str(other.id)


# --- namespaces and permissions (invariant 8) -----------------------------------------------


@pytest.fixture
def two_namespaces(staff, namespace, write):
    NamespaceFactory(name="acme.billing")
    mixed = batch(
        staff,
        PutOp(key(f"{NS}/order/a"), {"n": 1}),
        PutOp(key("acme.billing/invoice/i"), {"secret": 1}),
    )
    billing_only = write(staff, "acme.billing/invoice/j", {"secret": 2}).changeset
    orders_only = write(staff, f"{NS}/order/b", {"n": 2}).changeset
    return mixed, billing_only, orders_only


def test_reader_sees_only_records_in_namespaces_it_can_read(two_namespaces, make_user, client_for):
    mixed, billing_only, orders_only = two_namespaces
    reader = make_user("rita", reader=[NS])

    page = get_page(client_for(reader))

    assert [(r["changeset_id"], r["namespace"]) for r in page["records"]] == [
        (str(mixed.id), NS),
        (str(orders_only.id), NS),
    ]
    assert page["watermark"]["seq"] == orders_only.seq


def test_filtering_on_an_unreadable_namespace_yields_nothing(two_namespaces, make_user, client_for):
    reader = make_user("rita", reader=[NS])
    page = get_page(client_for(reader), namespace="acme.billing")
    assert page["records"] == []


def test_user_with_no_roles_sees_no_records_but_a_watermark(two_namespaces, make_user, client_for):
    nobody = make_user("nobody")
    page = get_page(client_for(nobody))
    assert page["records"] == []
    assert page["watermark"]["seq"] > 0


def test_namespace_filter_is_repeatable(two_namespaces, api):
    records = get_page(api, namespace=[NS, "acme.billing"])["records"]
    assert len(records) == 4
    only = get_page(api, namespace="acme.billing")["records"]
    assert {r["namespace"] for r in only} == {"acme.billing"}
    assert len(only) == 2


def test_invalid_namespace_filter_is_422(api, db):
    response = api.get(API, {"namespace": "Not Valid"})
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/namespace"


def test_anonymous_is_401(client, db):
    response = client.get(API)
    assert response.status_code == 401


# --- cost ---------------------------------------------------------------------------------


def test_a_page_costs_a_bounded_number_of_queries(
    api, staff, namespace, write, django_assert_max_num_queries
):
    for i in range(30):
        batch(
            staff,
            PutOp(key(f"{NS}/order/a{i}"), {"i": i}),
            DeleteOp(key(f"{NS}/order/zz"), missing_ok=True),
        )
    # auth (token, user), roles, rows, spill, their changesets, log head, watermark
    with django_assert_max_num_queries(8):
        page = get_page(api, limit=10)
    assert len(page["records"]) == 10


def test_event_ids_are_unique_and_stable(api, staff, namespace, write):
    write(staff, f"{NS}/order/a", {"n": 1})
    write(staff, f"{NS}/order/a", {"n": 2})
    first = [r["event_id"] for r in get_page(api)["records"]]
    again = [r["event_id"] for r in get_page(api, capture="new_row")["records"]]
    assert first == again
    assert len(set(first)) == 2
    changeset_id, _, ref = first[0].partition(":")
    uuid.UUID(changeset_id)
    assert ref == f"{NS}/order/a"
