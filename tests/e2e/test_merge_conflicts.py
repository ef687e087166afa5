"""The branch merge page in a real browser: conflicts per pointer, pick a side, merge.

Headless Chromium against ``live_server``. With ``ATLAS_SCREENSHOTS=1`` it writes
``docs/screenshots/merge-conflicts.png`` (shown in docs/branches.md).
"""

from __future__ import annotations

import re

import pytest

from branches.models import Branch, BranchStatus
from branches.services import branch_create
from branches.store import BranchStore
from changesets.models import Rpc
from changesets.ops import PutOp
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.changesets.test_admin import make_admin
from tests.e2e.test_admin_browser import log_in
from tests.entities.factories import NamespaceFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ORDER = EntityKey("acme.orders", "order", "o-1001")
OTHER = EntityKey("acme.orders", "order", "o-1002")


def put(actor, store, key, content) -> None:
    changeset_apply(store=store, actor=actor, ops=[PutOp(key, content)], rpc=Rpc.PUT_ENTITY)


def seed() -> Branch:
    NamespaceFactory(name="acme.orders")
    alice = make_admin("alice", writer=["acme.orders"])
    put(alice, baseline, ORDER, {"status": "placed", "carrier": "DHL", "note": "gift"})
    branch = branch_create(name="reship", actor=alice)
    on_branch = BranchStore(branch, writer=alice)
    put(alice, on_branch, ORDER, {"status": "shipped", "carrier": "UPS", "note": "gift"})
    put(alice, on_branch, OTHER, {"status": "placed"})
    # Baseline moves on: the same two pointers differently, and one the branch left alone.
    put(alice, baseline, ORDER, {"status": "cancelled", "carrier": "FedEx", "note": "urgent"})
    return branch


def test_pick_branch_or_baseline_per_conflicting_pointer_and_merge(live_server, page, screenshot):
    branch = seed()
    base = live_server.url
    log_in(page, base, "alice")

    page.goto(f"{base}/admin/branches/branch/{branch.pk}/change/")
    page.click("#branch-merge-link")
    page.wait_for_selector("#merge-conflicts")
    rows = page.locator("#merge-conflicts tbody tr")
    assert rows.count() == 2
    assert [rows.nth(i).get_attribute("data-pointer") for i in range(2)] == ["/carrier", "/status"]
    status = page.locator('#merge-conflicts tr[data-pointer="/status"]')
    assert '"placed"' in status.locator("td").nth(2).inner_text()  # base
    assert '"cancelled"' in status.locator("td").nth(3).inner_text()  # baseline now
    assert '"shipped"' in status.locator("td").nth(4).inner_text()  # branch
    assert page.get_attribute("#content-main", "data-merge-state") == "conflict"

    page.check('#merge-conflicts tr[data-pointer="/status"] input[value="branch"]')
    page.check('#merge-conflicts tr[data-pointer="/carrier"] input[value="baseline"]')
    page.fill("#id_comment", "reship: keep our status, their carrier")
    screenshot("merge-conflicts")
    page.click("#merge-submit")
    page.wait_for_url(re.compile(rf"/admin/branches/branch/{branch.pk}/change/"))
    assert "Merged branch 'reship' as changeset" in page.inner_text(".messagelist")

    branch.refresh_from_db()
    assert branch.status == BranchStatus.MERGED
    assert baseline.get(ORDER).content == {
        "status": "shipped",
        "carrier": "FedEx",
        "note": "urgent",
    }
    assert baseline.get(OTHER).content == {"status": "placed"}
