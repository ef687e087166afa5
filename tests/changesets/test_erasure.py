"""Erasure (API.md "Erasure"): a value spread everywhere, erased, found nowhere, log verified.

The issue's "done when": write a value, spread it (history on baseline and a
branch, feed pages, a parked webhook, an idempotent response, an export),
erase it, then (a) grep every column of every table by SQL, every endpoint
and the admin pages for it and find nothing, (b) ``verify_log`` is green, and
(c) 100 random tamperings of things not erased are all detected.
"""

from __future__ import annotations

import io
import json
import random
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client

from changesets import chain
from changesets.models import Changeset, Erasure, JournalEntry, LogHead, Revision, Subscription
from changesets.outbox import payloads
from changesets.selectors import feed
from tests.changesets.test_admin import make_admin

pytestmark = pytest.mark.django_db

NS = "acme.orders"
VALUE = "erase-me-5f1c@example.org"
STREET = "Erasegatan 17"
PATH = f"/api/v1/entities/{NS}/customer/c1"


def verify() -> tuple[chain.Break | None, chain.Stats]:
    def pairs():
        for changeset in Changeset.objects.order_by("seq"):
            yield changeset, list(Revision.objects.filter(changeset=changeset).order_by("id"))

    stats = chain.Stats()
    return chain.verify(pairs(), head=LogHead.objects.get(pk=1), stats=stats)[1], stats


def text(response: Any) -> str:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content).decode()
    return response.content.decode()


def grep_database(*needles: str) -> list[str]:
    """Every column of every table in the schema, as text (bytea as bytes), that holds a needle."""
    hits = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() ORDER BY table_name, column_name"
        )
        columns = cursor.fetchall()
        for table, column, data_type in columns:
            for needle in needles:
                if data_type == "bytea":
                    condition = f"position(convert_to(%s, 'UTF8') IN \"{column}\") > 0"
                else:
                    condition = f'strpos("{column}"::text, %s) > 0'
                cursor.execute(f'SELECT count(*) FROM "{table}" WHERE {condition}', [needle])
                if cursor.fetchone()[0]:
                    hits.append(f"{table}.{column}")
    return hits


@pytest.fixture
def root(make_user):
    user = make_admin("root", superuser=True)
    user.set_password("pw-for-tests-only")
    user.save()
    return user


@pytest.fixture
def spread(root, namespace, client_for, make_user):
    """The value written and spread to every place Atlas keeps or sends a copy."""
    api = client_for(root)
    content = {
        "email": VALUE,
        "name": "Ann",
        "age": 41,
        "address": {"street": STREET, "city": "Oslo"},
        "tags": ["a", VALUE],
    }
    first = api.put(
        PATH, {"content": content}, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )  # an idempotent response holding the value
    assert first.status_code == 201, first.content
    assert api.patch(PATH, {"patch": {"name": "Ann B"}}, format="json").status_code == 200
    api.put(f"/api/v1/entities/{NS}/customer/c2", {"content": {"n": 1}}, format="json")
    # A branch whose overlay holds the value, and history on it.
    assert api.post("/api/v1/branches", {"name": "feat"}, format="json").status_code == 201
    on_branch = api.patch(PATH, {"patch": {"age": 42}}, format="json", HTTP_X_ATLAS_BRANCH="feat")
    assert on_branch.status_code == 200, on_branch.content
    # A parked webhook delivery of the first changeset, whose receiver echoed the body.
    first_seq = Changeset.objects.order_by("seq").first().seq
    Subscription.objects.create(
        name="s",
        url="https://example.org/hook",
        secret="0" * 64,
        parked_seq=first_seq,
        parked_part=None,
        parked_error=f"HTTP 500: bad record {json.dumps({'email': VALUE})}",
        parked_attempts=8,
        last_error=f"HTTP 500: {VALUE}",
    )
    JournalEntry.objects.filter(seq=first_seq).update(last_error=f"hook failed on {VALUE}")
    # Before the erasure the value is where the test will look for it (so the
    # greps below can fail).
    export = api.get(f"/api/v1/changesets/{first.json()['changeset']['id']}/export")
    assert VALUE in text(export)
    assert VALUE in api.get("/api/v1/changes?capture=new_row").content.decode()
    tables = grep_database(VALUE, STREET)
    # (Not in ``changesets_revision.undo``: the patches left the value unchanged, so
    # their before images take it from ``after``; changesets.undo.)
    for where in (
        "changesets_revision.after",
        "entities_entity.content",
        "branches_branchentity.content",
        "atlas_idempotencyrecord.response_body",
        "changesets_subscription.parked_error",
        "changesets_journalentry.last_error",
    ):
        assert where in tables
    return {"api": api, "first": first, "content": content}


def erase(api: Any, **extra: Any) -> Any:
    body = {
        "targets": [
            {
                "namespace": NS,
                "kind": "customer",
                "slug": "c1",
                "pointers": ["/email", "/address/street", "/tags/1"],
            }
        ],
        "reason": "GDPR request 42",
        **extra,
    }
    return api.post("/api/v1/erase", body, format="json")


def endpoints(first_changeset: str, branch_changeset: str) -> list[str]:
    return [
        PATH,
        f"{PATH}/history",
        f"{PATH}/blame",
        f"{PATH}/diff?from={first_changeset}",
        f"{PATH}?as_of={first_changeset}",
        "/api/v1/entities?namespace=acme.orders",
        "/api/v1/changesets",
        f"/api/v1/changesets/{first_changeset}",
        f"/api/v1/changesets/{first_changeset}/revisions",
        f"/api/v1/changesets/{first_changeset}/export",
        f"/api/v1/changesets/{branch_changeset}/revisions",
        f"/api/v1/changesets/{branch_changeset}/export",
        f"/api/v1/revisions?namespace={NS}",
        f"/api/v1/diff?namespace={NS}&from={first_changeset}",
        "/api/v1/changes?capture=new_values",
        "/api/v1/changes?capture=new_row",
        "/api/v1/changes?capture=old_and_new_values",
        "/api/v1/branches/feat/diff",
        "/api/v1/subscriptions",
        "/api/v1/erasures",
    ]


def test_an_erased_value_is_nowhere_and_the_log_still_verifies(spread, root):
    api, first = spread["api"], spread["first"]
    first_changeset = first.json()["changeset"]["id"]
    branch_changeset = Changeset.objects.get(branch="feat").id

    response = erase(api)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["dry_run"] is False
    assert body["changeset"]["rpc"] == "EraseEntity"
    assert [c["branch"] for c in body["branch_changesets"]] == ["feat"]
    # Put, patch and the branch's patch each held the value in an image.
    assert body["erasure"]["revisions_redacted"] == 3
    assert body["erasure"]["targets"][0]["pointers"] == ["/email", "/address/street", "/tags/1"]

    # (a) by SQL: no column of any table holds it.
    assert grep_database(VALUE, STREET) == []
    # (a) every endpoint, the idempotent replay, the webhook a parked delivery would send.
    for url in endpoints(first_changeset, branch_changeset):
        got = api.get(url)
        assert got.status_code == 200, (url, got.content)
        body_text = text(got)
        assert VALUE not in body_text and STREET not in body_text, url
    on_branch = api.get(PATH, HTTP_X_ATLAS_BRANCH="feat")
    assert on_branch.json()["content"]["email"] == "[erased]"
    assert on_branch.json()["content"]["age"] == 42
    history = api.get(f"{PATH}/history", HTTP_X_ATLAS_BRANCH="feat").content.decode()
    assert VALUE not in history and "[erased]" in history
    replay = api.put(
        PATH, {"content": spread["content"]}, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert VALUE not in replay.content.decode()
    assert replay.json()["entity"]["content"]["email"] == "[erased]"
    subscription = Subscription.objects.get()
    page = feed.feed_page(
        after_seq=subscription.parked_seq - 1, namespaces=None, capture="new_row", limit=10
    )
    webhook = payloads.page_body(subscription, page, "d-1").decode()
    assert VALUE not in webhook and "[erased]" in webhook
    # (a) the admin pages.
    admin = Client()
    admin.force_login(root)
    revisions = Revision.objects.filter(slug="c1")
    pages = [
        "/admin/changesets/changeset/",
        *[
            f"/admin/changesets/changeset/{c}/change/"
            for c in revisions.values_list("changeset_id", flat=True)
        ],
        *[f"/admin/changesets/revision/{r.pk}/change/" for r in revisions],
        f"/admin/changesets/revision/entity/{NS}/customer/c1/",
        "/admin/entities/entity/",
        "/admin/branches/branchentity/",
        "/admin/changesets/erasure/",
        f"/admin/changesets/erasure/{Erasure.objects.get().pk}/change/",
        f"/admin/changesets/subscription/{subscription.pk}/change/",
    ]
    for url in pages:
        got = admin.get(url)
        assert got.status_code == 200, url
        body_text = text(got)
        assert VALUE not in body_text and STREET not in body_text, url

    # (b) verify_log is green and counts the erased images.
    out = io.StringIO()
    call_command("verify_log", "--no-progress", stdout=out)
    assert "ok:" in out.getvalue()
    broken, stats = verify()
    assert broken is None
    # put (after), patch (before, after), branch patch (before, after), and the
    # baseline and branch EraseEntity changesets' befores.
    assert stats.erased_images == 7


# An update's before image is stored as what differs from after (changesets.undo): a
# value the update left alone lives only in ``after``, one it changed or removed in
# ``undo``. Erased from either, it is gone from both images and the chain verifies.
OTHER = "other-9c2e@example.org"


@pytest.mark.parametrize(
    ("second", "undo_after"),
    [
        ({"email": VALUE, "n": 2}, {"n": 1}),  # unchanged: only in after
        ({"email": OTHER, "n": 1}, None),  # changed: in undo (both now read "[erased]")
        ({"n": 1}, {"email": "[erased]"}),  # removed: only in undo
    ],
    ids=["unchanged", "changed", "removed"],
)
def test_an_update_keeps_no_trace_of_an_erased_member_wherever_its_before_held_it(
    root, namespace, client_for, second, undo_after
):
    api = client_for(root)
    assert api.put(PATH, {"content": {"email": VALUE, "n": 1}}, format="json").status_code == 201
    written = api.put(PATH, {"content": second}, format="json")
    assert written.status_code == 200
    update = Revision.objects.get(changeset_id=written.json()["changeset"]["id"])
    assert update.before == {"email": VALUE, "n": 1}
    held = {w for w in grep_database(VALUE) if w.startswith("changesets_revision.")}
    changed = second.get("email") != VALUE
    assert held == {"changesets_revision.after"} | (
        {"changesets_revision.undo"} if changed else set()
    )

    response = erase(api)
    assert response.status_code == 200, response.content

    assert grep_database(VALUE, OTHER) == []
    update = Revision.objects.get(pk=update.pk)
    assert update.before == {"email": "[erased]", "n": 1}
    assert update.undo == undo_after
    history = api.get(f"{PATH}/history").content.decode()
    assert VALUE not in history and OTHER not in history
    broken, _ = verify()
    assert broken is None
    out = io.StringIO()
    call_command("verify_log", "--no-progress", stdout=out)
    assert "ok:" in out.getvalue()


def _tamper_not_erased(rng: random.Random) -> str:
    """One random edit of something the erasure did not erase."""
    from tests.changesets.test_chain import _disable_guards

    with connection.cursor() as cursor:
        _disable_guards(cursor)
        sealed = "SELECT id FROM changesets_revision WHERE sealed IS NOT NULL"
        choice = rng.randrange(8)
        if choice == 0:  # another top-level member of a partly erased image
            # (Not address/city: "address" is itself partly erased, and the chain's
            # unit is the top-level member; docs/architecture.md says so.)
            member = rng.choice(["name", "age"])
            path = "{" + member + "}"
            # The before image as stored: what differs from after (changesets.undo).
            side = rng.choice(["undo", "after"])
            cursor.execute(
                f"UPDATE changesets_revision SET {side} = jsonb_set({side}, '{path}', '\"x\"')"
                f" WHERE id = (SELECT id FROM changesets_revision WHERE sealed IS NOT NULL"
                f" AND {side} IS NOT NULL ORDER BY random() LIMIT 1)"
            )
            return f"partly erased {side} {member}"
        if choice == 1:  # a member added to a partly erased image
            cursor.execute(
                "UPDATE changesets_revision SET after = after || '{\"new\": 1}'"
                f" WHERE id = ({sealed} AND after IS NOT NULL ORDER BY random() LIMIT 1)"
            )
            return "member added"
        if choice == 2:  # another revision
            cursor.execute(
                "UPDATE changesets_revision SET after = jsonb_set(after, '{n}', '7')"
                " WHERE id = (SELECT id FROM changesets_revision WHERE sealed IS NULL"
                " AND after IS NOT NULL ORDER BY random() LIMIT 1)"
            )
            return "other revision"
        if choice == 3:  # changeset metadata and context
            field = rng.choice(["metadata", "context"])
            cursor.execute(
                f"UPDATE changesets_changeset SET {field} = COALESCE({field}, '{{}}')"
                " || '{\"x\": 1}' WHERE id = (SELECT id FROM changesets_changeset"
                " ORDER BY random() LIMIT 1)"
            )
            return field
        if choice == 4:  # a changeset's fields
            field = rng.choice(["author_name", "comment", "message"])
            # A stored NULL message reads as the rule's text (migration 0033): any
            # text put there instead is an edit.
            cursor.execute(
                f"UPDATE changesets_changeset SET {field} = COALESCE({field}, '') || 'x'"
                " WHERE id = (SELECT id FROM changesets_changeset ORDER BY random() LIMIT 1)"
            )
            return field
        if choice == 5:  # a kept key or digest in a seal
            cursor.execute(
                "UPDATE changesets_revision SET sealed = jsonb_set(sealed, '{after,name}',"
                ' \'{"k": "00"}\') WHERE id = ('
                f"{sealed} AND after IS NOT NULL ORDER BY random() LIMIT 1)"
            )
            return "seal key"
        if choice == 6:  # an erased member claimed for a member not erased
            cursor.execute(
                "UPDATE changesets_revision SET after = jsonb_set(after, '{name}', '\"[erased]\"'),"
                " sealed = jsonb_set(sealed, '{after,name}', '{\"d\": \"00\"}') WHERE id = ("
                f"{sealed} AND after IS NOT NULL ORDER BY random() LIMIT 1)"
            )
            return "erasure forged"
        cursor.execute(
            "UPDATE changesets_revision SET after_version = after_version + 1"
            " WHERE id = (SELECT id FROM changesets_revision WHERE after IS NOT NULL"
            " ORDER BY random() LIMIT 1)"
        )
        return "version"


def test_after_erasure_one_hundred_tamperings_of_what_was_not_erased_are_all_caught(spread):
    assert erase(spread["api"]).status_code == 200
    for i in range(6):  # more history around the erased entity
        spread["api"].patch(PATH, {"patch": {"n": i}}, format="json")
    assert verify()[0] is None
    rng = random.Random(16)
    missed = []
    for trial in range(100):
        sid = transaction.savepoint()
        what = _tamper_not_erased(rng)
        if verify()[0] is None:
            missed.append((trial, what))
        transaction.savepoint_rollback(sid)
    assert verify()[0] is None
    assert missed == [], missed


def test_a_dry_run_counts_the_same_and_writes_nothing(spread):
    before = (Changeset.objects.count(), grep_database(VALUE))
    dry = erase(spread["api"], dry_run=True)
    assert dry.status_code == 200, dry.content
    assert dry.json()["dry_run"] is True and dry.json()["changeset"] is None
    assert (Changeset.objects.count(), grep_database(VALUE)) == before
    assert not Erasure.objects.exists()
    real = erase(spread["api"])
    assert (
        real.json()["erasure"]["revisions_redacted"] == dry.json()["erasure"]["revisions_redacted"]
    )


def test_erasing_again_finds_nothing_left_and_still_verifies(spread):
    assert erase(spread["api"]).status_code == 200
    again = erase(spread["api"]).json()
    assert again["changeset"] is None and again["branch_changesets"] == []
    assert again["erasure"]["revisions_redacted"] == 0
    # A second erasure of another member of the same, already sealed, images.
    other = spread["api"].post(
        "/api/v1/erase",
        {
            "targets": [{"namespace": NS, "kind": "customer", "slug": "c1", "pointers": ["/name"]}],
            "reason": "second",
        },
        format="json",
    )
    assert other.status_code == 200 and other.json()["erasure"]["revisions_redacted"] >= 2
    assert verify()[0] is None
    assert Erasure.objects.count() == 3


def test_who_may_erase(spread, make_user, client_for):
    reader = make_user("rita", reader=[NS])
    writer = make_user("wendy", writer=[NS])
    outsider = make_user("olga", reader=["acme.other"])
    maintainer = make_user("mona", maintainer=[NS])
    assert erase(client_for(reader)).status_code == 403
    assert erase(client_for(writer)).status_code == 403
    assert erase(client_for(outsider)).status_code == 404
    assert grep_database(VALUE) != []
    assert erase(client_for(maintainer)).status_code == 200
    assert client_for(outsider).get("/api/v1/erasures").json()["results"] == []
    assert len(client_for(reader).get("/api/v1/erasures").json()["results"]) == 1


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"targets": [], "reason": "r"}, 422),
        (
            {
                "targets": [
                    {"namespace": NS, "kind": "customer", "slug": "c1", "pointers": ["email"]}
                ],
                "reason": "r",
            },
            422,
        ),
        (
            {
                "targets": [{"namespace": NS, "kind": "customer", "slug": "c1", "pointers": [""]}],
                "reason": "r",
            },
            422,
        ),
        (
            {
                "targets": [
                    {"namespace": NS, "kind": "customer", "slug": "c1", "pointers": ["/a"]}
                ],
                "reason": "",
            },
            422,
        ),
        (
            {
                "targets": [
                    {"namespace": NS, "kind": "customer", "slug": "c1", "pointers": ["/a"], "x": 1}
                ],
                "reason": "r",
            },
            422,
        ),
        (
            {
                "targets": [
                    {"namespace": "no.such", "kind": "customer", "slug": "c1", "pointers": ["/a"]}
                ],
                "reason": "r",
            },
            404,
        ),
    ],
)
def test_bad_erase_bodies_are_problems(root, namespace, client_for, body, status):
    got = client_for(root).post("/api/v1/erase", body, format="json")
    assert got.status_code == status, got.content
    assert got["Content-Type"].startswith("application/problem+json")


def test_erasures_are_paged_newest_first(spread):
    api = spread["api"]
    for i in range(3):
        api.post(
            "/api/v1/erase",
            {
                "targets": [
                    {"namespace": NS, "kind": "customer", "slug": "c2", "pointers": [f"/p{i}"]}
                ],
                "reason": f"r{i}",
            },
            format="json",
        )
    first = api.get("/api/v1/erasures?page_size=2").json()
    assert [e["reason"] for e in first["results"]] == ["r2", "r1"]
    rest = api.get(f"/api/v1/erasures?page_size=2&page_token={first['next_page_token']}").json()
    assert [e["reason"] for e in rest["results"]] == ["r0"] and rest["next_page_token"] is None


def test_a_forged_erasure_record_breaks_verify_log(spread):
    assert erase(spread["api"]).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE changesets_erasure DISABLE TRIGGER erasure_append_only")
        cursor.execute("UPDATE changesets_erasure SET reason = 'nothing to see'")
    with pytest.raises(SystemExit):
        call_command("verify_log", "--no-progress", stdout=io.StringIO(), stderr=io.StringIO())


def test_the_erase_command_erases_across_a_namespace_by_value(spread, root):
    spread["api"].put(
        f"/api/v1/entities/{NS}/customer/c3", {"content": {"email": VALUE, "k": 3}}, format="json"
    )
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "erase",
        "--namespace",
        NS,
        "--where",
        f"/email={VALUE}",
        "--pointer",
        "/address/street",
        "--pointer",
        "/tags/1",
        "--reason",
        "GDPR batch",
        "--user",
        "root",
        "--no-progress",
        stdout=out,
        stderr=err,
    )
    assert "2 entit" in out.getvalue()
    assert grep_database(VALUE, STREET) == []
    assert verify()[0] is None
