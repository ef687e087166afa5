"""The admin in a real browser: find a changeset by slug, read its diff, revert it.

Runs against ``live_server`` (a real HTTP server on 127.0.0.1 over the test
database) with headless Chromium. With ``ATLAS_SCREENSHOTS=1`` the walk
also writes the screenshots in docs/screenshots/ shown in the README.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from changesets.models import Changeset, JournalEntry, Rpc
from changesets.ops import DeleteOp, PutOp
from changesets.outbox.journal import publish
from changesets.services.apply import changeset_apply
from entities.models import Entity
from entities.store import EntityKey, baseline
from tests.changesets.test_admin import make_admin
from tests.entities.factories import NamespaceFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-for-tests-only"


def apply(actor: Any, *ops: Any, rpc: str = Rpc.BATCH_MUTATE, comment: str = "") -> Changeset:
    return changeset_apply(
        store=baseline, actor=actor, ops=list(ops), rpc=rpc, comment=comment
    ).changeset


def k(path: str) -> EntityKey:
    return EntityKey(*path.split("/"))


def seed() -> dict[str, Any]:
    """A small, realistic log: orders and customers edited by three people."""
    NamespaceFactory(name="acme.orders")
    NamespaceFactory(name="acme.customers")
    demo = make_admin("demo", superuser=True)
    alice = make_admin("alice", writer=["acme.orders", "acme.customers"])
    bob = make_admin("bob", reader=["acme.orders"])
    apply(
        alice,
        PutOp(k("acme.customers/customer/c-042"), {"name": "Ada Lovelace", "tier": "gold"}),
        rpc=Rpc.PUT_ENTITY,
    )
    apply(
        alice,
        PutOp(
            k("acme.orders/order/o-1001"),
            {
                "customer": "c-042",
                "status": "placed",
                "lines": [{"sku": "TEA-01", "qty": 2, "price": 4.5}],
                "shipping": {"method": "standard", "address": {"city": "London"}},
            },
        ),
        PutOp(k("acme.orders/order/o-1002"), {"customer": "c-042", "status": "placed"}),
        comment="Orders imported from the shop",
    )
    apply(
        demo,
        PutOp(k("acme.customers/customer/c-043"), {"name": "Charles Babbage", "tier": "silver"}),
        rpc=Rpc.PUT_ENTITY,
    )
    target = apply(
        alice,
        PutOp(
            k("acme.orders/order/o-1001"),
            {
                "customer": "c-042",
                "status": "shipped",
                "lines": [{"sku": "TEA-01", "qty": 3, "price": 4.5}],
                "shipping": {"method": "express", "address": {"city": "London"}},
                "tracking": "ZX-9921",
            },
        ),
        DeleteOp(k("acme.orders/order/o-1002")),
        PutOp(k("acme.orders/order/o-1003"), {"customer": "c-043", "status": "placed"}),
        comment="Ship o-1001 express; cancel o-1002",
    )
    return {"demo": demo, "alice": alice, "bob": bob, "target": target}


def log_in(page: Any, base: str, username: str) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")


def test_find_by_slug_read_the_diff_preview_and_confirm_a_revert(live_server, page, screenshot):
    data = seed()
    target = data["target"]
    base = live_server.url
    log_in(page, base, "alice")

    # Find the changeset by entity slug.
    page.goto(f"{base}/admin/changesets/changeset/")
    page.fill("#searchbar", "o-1001")
    page.press("#searchbar", "Enter")
    page.wait_for_url(re.compile(r"q=o-1001"))
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2  # the create and the change, once each
    assert f"#{target.seq}" in rows.first.inner_text()
    screenshot("changelist")

    # Open its diff.
    rows.first.locator("a", has_text=f"#{target.seq}").click()
    page.wait_for_selector("#ops-table")
    assert page.locator("#ops-table tbody tr").count() == 3
    changed = page.locator(".atlas-op-diff", has_text="acme.orders/order/o-1001")
    assert changed.locator('tr[data-key="status"][data-status="changed"]').count() == 1
    assert changed.locator('tr[data-key="tracking"][data-status="added"]').count() == 1
    assert changed.locator(".atlas-ins", has_text='"qty": 3').count() == 1
    assert "published" in page.inner_text("#journal-status")
    screenshot("changeset_detail")

    # Preview the revert (a dry run), then confirm it.
    page.click("#revert-button")
    page.wait_for_selector("#inverse-ops")
    assert page.locator("#inverse-ops tbody tr").count() == 3
    preview = page.inner_text("#content-main")
    assert "Delete it: changeset" in preview and "Re-create it as it was before" in preview
    assert Changeset.objects.count() == 4  # the preview wrote nothing
    page.fill("#id_comment", "Customer called: undo the shipment change")
    screenshot("revert_preview")
    page.click("#confirm-revert")

    # The new changeset is shown, authored by the logged-in user.
    page.wait_for_selector("#ops-table")
    new = Changeset.objects.order_by("-seq").first()
    assert new.rpc == Rpc.REVERT_CHANGESET and new.author_name == "alice"
    assert page.url.endswith(f"/admin/changesets/changeset/{new.pk}/change/")
    assert f"Reverted changeset #{target.seq} as changeset #{new.seq}" in page.inner_text(
        ".messagelist"
    )
    assert "RevertChangeset" in page.inner_text("#changeset-summary")
    assert "Customer called" in page.inner_text("#changeset-summary")
    assert Entity.objects.get(slug="o-1001").content["status"] == "placed"
    assert Entity.objects.filter(slug="o-1002").exists()
    assert not Entity.objects.filter(slug="o-1003").exists()

    # The entity's history shows all three changes, newest first.
    page.locator("#ops-table tr", has_text="o-1001").locator("a", has_text="history").click()
    page.wait_for_selector("#timeline")
    assert page.locator("#timeline > li").count() == 3
    assert "RevertChangeset" in page.locator("#timeline > li").first.inner_text()
    screenshot("entity_history")
    page.locator(".atlas-as-of-link").nth(1).click()
    page.wait_for_selector("#as-of-content")
    assert '"status": "shipped"' in page.inner_text("#as-of-content")
    screenshot("entity_as_of")


def test_a_reader_browses_but_gets_no_revert_button(live_server, page):
    data = seed()
    base = live_server.url
    log_in(page, base, "bob")
    page.goto(f"{base}/admin/changesets/changeset/{data['target'].pk}/change/")
    page.wait_for_selector("#ops-table")
    assert page.locator("#revert-button").count() == 0
    # bob reads acme.orders only: the customers' changesets are not listed at all
    page.goto(f"{base}/admin/changesets/changeset/")
    listing = page.inner_text("#result_list")
    assert "acme.customers" not in listing
    assert page.locator("#result_list tbody tr").count() == 2


def test_the_journal_page_lists_what_is_still_owed(live_server, page, screenshot):
    # Publishing deletes an entry (migration 0026): the page lists outstanding work
    # only, with its attempts and last error, and a changeset's page says which.
    data = seed()
    target = data["target"]
    # No worker runs here: every entry is outstanding. Publish all but the target's
    # and one other, and give the target's a history of failures.
    entries = JournalEntry.objects.order_by("seq")
    assert entries.count() == 4
    kept = entries.first()
    publish(
        [e.changeset_id for e in entries if e.changeset_id not in (target.id, kept.changeset_id)]
    )
    JournalEntry.objects.filter(changeset=target).update(
        attempts=3, failures=3, last_error="OperationalError: the broker refused the connection"
    )
    base = live_server.url
    log_in(page, base, "demo")
    page.goto(f"{base}/admin/changesets/journalentry/")
    assert page.inner_text("#content h1") == "Journal entries still to publish"
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    newest = rows.first.inner_text()
    assert f"#{target.seq}" in newest and "broker refused" in newest
    assert f"#{kept.seq}" in rows.nth(1).inner_text()
    screenshot("journal")
    rows.first.locator("a", has_text=f"#{target.seq}").click()
    page.wait_for_selector("#journal-status")
    status = page.inner_text("#journal-status")
    assert "committed" in status and "3 failed" in status and "broker refused" in status
