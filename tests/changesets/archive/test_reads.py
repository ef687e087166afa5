"""Reads across an archive cut (API.md "Archive and retention"): a 410 for each old surface.

Lists and history end at the cut with ``archived_before``; a cursor, ``as_of``,
``as_of_time``, ``since`` or changeset id at or before it is a 410 naming the
checkpoint and the archive; reads after it, and current entities, answer as
they did before the cut.
"""

from __future__ import annotations

import uuid

import pytest
import uuid6

from branches.models import Branch
from changesets.archive import signing
from changesets.archive.models import ArchiveCut
from changesets.models import Changeset, LogHead
from changesets.outbox import delivery
from changesets.outbox.subscriptions import subscription_create, subscription_skip
from changesets.selectors.feed import cursor_encode
from tests.changesets.archive.conftest import NS_A, NS_B, cut, public_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def archived(seed, archive_dir, write, client_for, publish_committed):
    """A seeded log cut after its tenth changeset, with a few changesets after the cut."""
    seeded = seed(3)
    write(seeded.root, f"{NS_A}/doc/a", {"n": "after the cut"})
    write(seeded.root, f"{NS_B}/doc/fresh", {"new": True})
    publish_committed()
    target = seeded.seq_of(9)
    old = list(Changeset.objects.filter(seq__lte=target).order_by("seq"))
    client = client_for(seeded.root)
    before = {
        "entities": client.get(f"/api/v1/entities?namespace={NS_A}").json(),
        "as_of": client.get(
            f"/api/v1/entities?namespace={NS_A}&as_of={Changeset.objects.get(seq=target + 1).id}"
        ).json(),
    }
    cut(target + 1)
    return {
        "seeded": seeded,
        "cut": ArchiveCut.objects.get(),
        "old": old,
        "client": client,
        "before": before,
    }


def _gone(response, cut_row) -> dict:
    assert response.status_code == 410, response.content
    assert response["Content-Type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == 410
    assert body["checkpoint"] == cut_row.hash
    assert body["archive"] == cut_row.location and body["archive"].startswith("file://")
    assert body["archived_before"] == {"seq": cut_row.seq, "checkpoint": cut_row.hash}
    return body


def _marker(cut_row) -> dict:
    return {"seq": cut_row.seq, "checkpoint": cut_row.hash}


def test_the_changeset_list_ends_at_the_cut(archived):
    client, cut_row = archived["client"], archived["cut"]
    body = client.get("/api/v1/changesets?page_size=500").json()
    assert body["next_page_token"] is None
    assert body["archived_before"] == _marker(cut_row)
    assert min(c["seq"] for c in body["results"]) == cut_row.seq + 1
    first = client.get("/api/v1/changesets?page_size=1").json()
    assert "archived_before" not in first  # only the last page ends at the cut


def test_an_archived_changeset_is_gone_on_every_surface(archived):
    client, cut_row = archived["client"], archived["cut"]
    old = archived["old"][3].id
    for path in ("", "/revisions", "/export"):
        _gone(client.get(f"/api/v1/changesets/{old}{path}"), cut_row)
    _gone(client.post(f"/api/v1/changesets/{old}/revert", {}, format="json"), cut_row)
    _gone(
        client.post(f"/api/v1/changesets/{old}/revert", {"dry_run": True}, format="json"), cut_row
    )


def test_an_unknown_id_is_gone_when_it_may_be_archived_and_missing_after(archived):
    client, cut_row = archived["client"], archived["cut"]
    _gone(client.get(f"/api/v1/changesets/{uuid.UUID(int=1)}"), cut_row)
    assert client.get(f"/api/v1/changesets/{uuid6.uuid7()}").status_code == 404


def test_since_at_or_before_the_cut_is_gone(archived):
    client, cut_row = archived["client"], archived["cut"]
    at = cut_row.at.isoformat().replace("+00:00", "Z")
    _gone(client.get(f"/api/v1/changesets?since={at}"), cut_row)
    _gone(client.get(f"/api/v1/revisions?namespace={NS_A}&since={at}"), cut_row)
    _gone(client.get(f"/api/v1/revisions?namespace={NS_A}&key=/a&since={at}"), cut_row)
    later = Changeset.objects.get(seq=cut_row.seq + 1).at.isoformat().replace("+00:00", "Z")
    body = client.get(f"/api/v1/changesets?since={later}").json()
    assert {c["seq"] for c in body["results"]} >= {cut_row.seq + 1}


def test_the_feed_starts_at_the_cut_and_refuses_an_older_cursor(archived):
    client, cut_row = archived["client"], archived["cut"]
    body = client.get("/api/v1/changes").json()
    assert body["archived_before"] == _marker(cut_row)
    assert min(r["seq"] for r in body["records"]) == cut_row.seq + 1
    _gone(client.get(f"/api/v1/changes?since={cursor_encode(cut_row.seq - 1)}"), cut_row)
    _gone(client.get(f"/api/v1/changes?since={cursor_encode(0)}"), cut_row)
    # API.md: a cursor at or before the cut is 410 (the cut itself included).
    _gone(client.get(f"/api/v1/changes?since={cursor_encode(cut_row.seq)}"), cut_row)
    later = client.get(f"/api/v1/changes?since={cursor_encode(cut_row.seq + 1)}").json()
    assert "archived_before" not in later


def test_entity_history_ends_at_the_cut(archived):
    client, cut_row = archived["client"], archived["cut"]
    body = client.get(f"/api/v1/entities/{NS_A}/doc/a/history").json()
    assert body["archived_before"] == _marker(cut_row)
    assert all(r["seq"] > cut_row.seq for r in body["results"]) and body["results"]
    # A key whose whole history is archived: an empty history that ends at the cut.
    gone = client.get(f"/api/v1/entities/{NS_A}/doc/b0/history")
    assert gone.status_code == 200
    assert gone.json() == {
        "results": [],
        "next_page_token": None,
        "archived_before": _marker(cut_row),
    }
    keyed = client.get(f"/api/v1/entities/{NS_A}/doc/a/history?key=/extra").json()
    assert keyed["archived_before"] == _marker(cut_row)


def test_revisions_across_a_namespace_end_at_the_cut(archived):
    client, cut_row = archived["client"], archived["cut"]
    body = client.get(f"/api/v1/revisions?namespace={NS_A}&page_size=500").json()
    assert body["archived_before"] == _marker(cut_row)
    assert all(r["seq"] > cut_row.seq for r in body["results"])


def test_as_of_at_or_before_the_cut_is_gone_and_after_it_unchanged(archived):
    client, cut_row = archived["client"], archived["cut"]
    old = archived["old"][-1].id
    _gone(client.get(f"/api/v1/entities?namespace={NS_A}&as_of={old}"), cut_row)
    _gone(client.get(f"/api/v1/entities/{NS_A}/doc/a?as_of={old}"), cut_row)
    _gone(client.get(f"/api/v1/entities/{NS_A}/doc/a/blame?as_of={old}"), cut_row)
    _gone(client.get(f"/api/v1/entities/{NS_A}/doc/a/diff?from={old}"), cut_row)
    _gone(client.get(f"/api/v1/diff?namespace={NS_A}&from={old}"), cut_row)
    after = Changeset.objects.get(seq=cut_row.seq + 1).id
    again = client.get(f"/api/v1/entities?namespace={NS_A}&as_of={after}").json()
    assert again == archived["before"]["as_of"]


def test_as_of_time_resolving_to_the_cut_or_before_is_gone(archived):
    client, cut_row = archived["client"], archived["cut"]
    at = cut_row.at.isoformat().replace("+00:00", "Z")
    _gone(client.get(f"/api/v1/entities?namespace={NS_A}&as_of_time={at}"), cut_row)
    _gone(client.get(f"/api/v1/entities?namespace={NS_A}&as_of_time=2000-01-01T00:00:00Z"), cut_row)
    now = LogHead.objects.get().at.isoformat().replace("+00:00", "Z")
    assert client.get(f"/api/v1/entities?namespace={NS_A}&as_of_time={now}").status_code == 200


def test_current_entities_are_unaffected(archived):
    body = archived["client"].get(f"/api/v1/entities?namespace={NS_A}").json()
    assert body == archived["before"]["entities"]


def test_restore_to_an_archived_point_is_gone(archived):
    client, cut_row = archived["client"], archived["cut"]
    old = archived["old"][-1].id
    path = f"/api/v1/entities/{NS_A}/doc/a/restore"
    _gone(client.post(path, {"as_of": str(old)}, format="json"), cut_row)
    _gone(client.post(path, {"version": 2}, format="json"), cut_row)  # superseded before it
    # The state at the cut holds the life's create and its last version then: both restore.
    assert client.post(path, {"version": 1, "dry_run": True}, format="json").status_code == 200
    assert client.post(path, {"version": 999}, format="json").status_code == 404
    _gone(client.post("/api/v1/restore", {"namespace": NS_A, "as_of": str(old)}, format="json"),
          cut_row)  # fmt: skip


def test_blame_lists_the_leaves_set_before_the_cut_as_archived(archived):
    client, cut_row = archived["client"], archived["cut"]
    body = client.get(f"/api/v1/entities/{NS_A}/doc/b2/blame").json()
    assert body["archived_before"] == _marker(cut_row)
    assert body["archived"] == ["/title"] and body["keys"] == []
    fresh = client.get(f"/api/v1/entities/{NS_B}/doc/fresh/blame").json()
    assert "archived" not in fresh and [k["pointer"] for k in fresh["keys"]] == ["/new"]


def test_checkpoints_are_published_with_the_public_key(archived):
    client, cut_row = archived["client"], archived["cut"]
    body = client.get("/api/v1/log/checkpoints").json()
    assert body["public_key"] == public_key()
    [one] = body["results"]
    assert (one["seq"], one["hash"]) == (cut_row.seq, cut_row.hash)
    assert {"name", "digest", "first_seq", "last_seq"} <= set(one["segments"][0])
    assert signing.verify(one, signing.load_public_key(body["public_key"]))
    assert body["next_page_token"] is None


def test_checkpoints_need_an_authenticated_user(archived, client_for):
    assert client_for(None).get("/api/v1/log/checkpoints").status_code == 401


def test_a_subscription_behind_the_cut_parks_and_skip_moves_it_to_the_cut(archived):
    cut_row = archived["cut"]
    behind = subscription_create(actor=None, name="old", url="https://example.test/hook",
                                 active=True)  # fmt: skip
    assert behind.cursor_seq == cut_row.seq  # made after the cut: "the beginning" is the cut
    type(behind).objects.filter(pk=behind.pk).update(cursor_seq=2)
    assert delivery.deliver_next_page(str(behind.pk)).outcome == "parked"
    behind.refresh_from_db()
    assert behind.parked_seq == cut_row.seq and "archived" in behind.parked_error
    skipped = subscription_skip(subscription_id=behind.pk, actor=None)
    assert skipped.cursor_seq == cut_row.seq and skipped.parked_seq is None


def test_the_admin_log_pages_say_where_the_log_begins(archived, client):
    cut_row = archived["cut"]
    client.force_login(archived["seeded"].root)
    page = client.get("/admin/changesets/changeset/")
    assert page.status_code == 200
    assert f"History through seq {cut_row.seq} is archived" in page.content.decode()
    assert client.get("/admin/changesets/revision/").status_code == 200
    old = archived["old"][2].id
    detail = client.get(f"/admin/changesets/changeset/{old}/change/")
    assert detail.status_code == 410 and cut_row.hash in detail.content.decode()
    assert client.get(f"/admin/changesets/changeset/{old}/revert/").status_code == 410
    history = client.get(f"/admin/changesets/revision/entity/{NS_A}/doc/b0/")
    assert history.status_code == 200 and "is archived" in history.content.decode()
    as_of = client.get(f"/admin/changesets/revision/entity/{NS_A}/doc/a/as-of/{old}/")
    assert as_of.status_code == 410


def test_a_branch_whose_fork_and_merge_are_archived_still_reads(
    seed, archive_dir, client_for, client
):
    seeded = seed(2)
    cut(LogHead.objects.get().seq + 1)  # the merged branch's fork and merge included
    api = client_for(seeded.root).get("/api/v1/branches/arch-feature")
    assert api.status_code == 200, api.content
    assert api.json()["status"] == "merged" and api.json()["merged_changeset_id"]
    client.force_login(seeded.root)
    page = client.get(f"/admin/branches/branch/{Branch.objects.get().pk}/change/")
    assert page.status_code == 200


# One test per surface at exactly the cut C (API.md: "at or before C → 410").


def test_a_feed_cursor_at_the_cut_is_gone(archived):
    client, cut_row = archived["client"], archived["cut"]
    _gone(client.get(f"/api/v1/changes?since={cursor_encode(cut_row.seq)}"), cut_row)


def test_as_of_the_changeset_at_the_cut_is_gone(archived):
    client, cut_row = archived["client"], archived["cut"]
    at_cut = archived["old"][-1]
    assert at_cut.seq == cut_row.seq
    _gone(client.get(f"/api/v1/entities?namespace={NS_A}&as_of={at_cut.id}"), cut_row)


def test_since_the_cuts_time_is_gone(archived):
    client, cut_row = archived["client"], archived["cut"]
    at = cut_row.at.isoformat().replace("+00:00", "Z")
    _gone(client.get(f"/api/v1/changesets?since={at}"), cut_row)


def test_the_changeset_id_at_the_cut_is_gone(archived):
    client, cut_row = archived["client"], archived["cut"]
    _gone(client.get(f"/api/v1/changesets/{archived['old'][-1].id}"), cut_row)


def test_the_planner_keeps_the_cut_below_a_live_subscriptions_cursor(seed, archive_dir):
    from changesets.archive import plan
    from changesets.models import Subscription

    seeded = seed(3)
    at = seeded.seq_of(6)
    Subscription.objects.create(name="live", url="https://example.test/hook", cursor_seq=at)
    planned = plan.plan_cut(at + 5)
    assert planned.seq == at - 1
    assert any("subscription" in why for why in planned.limits)
