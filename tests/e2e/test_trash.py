"""The trash in a real browser: find a deleted entity, preview its restore, confirm it.

Runs against ``live_server`` with headless Chromium, like
``test_admin_browser``. With ``ATLAS_SCREENSHOTS=1`` the walk writes
``docs/screenshots/trash.png`` and ``trash_restore_preview.png``, shown in
docs/history.md.
"""

from __future__ import annotations

from typing import Any

import pytest

from changesets.models import Changeset, Rpc
from changesets.ops import DeleteOp, PutOp
from changesets.services.apply import changeset_apply
from entities.models import Entity
from entities.store import EntityKey, baseline
from tests.changesets.test_admin import make_admin
from tests.e2e.test_admin_browser import log_in
from tests.entities.factories import NamespaceFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def apply(actor: Any, *ops: Any, comment: str = "") -> Changeset:
    result = changeset_apply(
        store=baseline, actor=actor, ops=list(ops), rpc=Rpc.BATCH_MUTATE, comment=comment
    )
    assert result.changeset is not None
    return result.changeset


def k(path: str) -> EntityKey:
    return EntityKey(*path.split("/"))


def seed() -> dict[str, Any]:
    """Orders placed, one edited, then two cancelled (deleted) by bob."""
    NamespaceFactory(name="acme.orders")
    alice = make_admin("alice", writer=["acme.orders"])
    bob = make_admin("bob", writer=["acme.orders"])
    make_admin("rhea", reader=["acme.orders"])
    apply(
        alice,
        PutOp(k("acme.orders/order/o-1001"), {"customer": "c-042", "status": "placed"}),
        PutOp(k("acme.orders/order/o-1002"), {"customer": "c-043", "status": "placed"}),
        PutOp(k("acme.orders/order/o-1003"), {"customer": "c-044", "status": "placed"}),
    )
    apply(
        alice,
        PutOp(
            k("acme.orders/order/o-1002"),
            {"customer": "c-043", "status": "paid", "lines": [{"sku": "TEA-01", "qty": 2}]},
        ),
    )
    deleting = apply(
        bob,
        DeleteOp(k("acme.orders/order/o-1002")),
        DeleteOp(k("acme.orders/order/o-1003")),
        comment="Clean up cancelled orders",
    )
    return {"alice": alice, "deleting": deleting}


def test_find_a_deleted_entity_preview_and_confirm_its_restore(live_server, page, screenshot):
    data = seed()
    base = live_server.url
    log_in(page, base, "alice")

    # From the entity list to the trash of acme.orders.
    page.goto(f"{base}/admin/entities/entity/")
    page.click("#trash-link")
    page.wait_for_selector("#trash-namespaces")
    page.click("#trash-namespaces a:has-text('acme.orders')")
    page.wait_for_selector("#trash-table")
    rows = page.locator("#trash-table tbody tr")
    assert rows.count() == 2
    row = page.locator('#trash-table tr[data-key="acme.orders/order/o-1002"]')
    assert "v2" in row.inner_text() and "bob" in row.inner_text()
    assert f"#{data['deleting'].seq}" in row.inner_text()
    screenshot("trash")

    # Preview (a dry run), then confirm.
    row.locator(".atlas-restore-button").click()
    page.wait_for_selector("#restore-plan")
    assert page.locator('#restore-plan tr[data-key="status"][data-status="added"]').count() == 1
    assert Changeset.objects.count() == 3  # the preview wrote nothing
    page.fill("#id_comment", "Customer paid after all")
    screenshot("trash_restore_preview")
    page.click("#confirm-restore")

    # The new changeset is shown, authored by alice; the entity is back, out of the trash.
    page.wait_for_selector("#ops-table")
    new = Changeset.objects.order_by("-seq").first()
    assert new.rpc == Rpc.RESTORE_ENTITY and new.author_name == "alice"
    assert "Restored acme.orders/order/o-1002" in page.inner_text(".messagelist")
    assert "Customer paid after all" in page.inner_text("#changeset-summary")
    entity = Entity.objects.get(slug="o-1002")
    assert entity.content["status"] == "paid" and entity.version == 3
    page.goto(f"{base}/admin/changesets/revision/deleted/acme.orders/")
    page.wait_for_selector("#trash-table")
    assert page.locator("#trash-table tbody tr[data-key]").count() == 1


def test_a_reader_sees_the_trash_without_restore_buttons(live_server, page):
    seed()
    base = live_server.url
    log_in(page, base, "rhea")
    page.goto(f"{base}/admin/changesets/revision/deleted/acme.orders/")
    page.wait_for_selector("#trash-table")
    assert page.locator("#trash-table tbody tr[data-key]").count() == 2
    assert page.locator(".atlas-restore-button").count() == 0
