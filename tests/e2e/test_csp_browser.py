"""The Content-Security-Policy blocks nothing Atlas's own pages need (real Chromium).

Every page an operator opens — the admin's log, diff, revert preview, entity
history, the roles page, the token pages, and Swagger UI at /api/docs/ — is
loaded under the policy, and the browser must report no violation (a
``securitypolicyviolation`` event or a console error naming the policy).
"""

from __future__ import annotations

from typing import Any

import pytest

from changesets.models import Changeset, Rpc
from changesets.ops import PutOp
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.changesets.test_admin import make_admin
from tests.entities.factories import NamespaceFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-for-tests-only"
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(e.violatedDirective + " " + e.blockedURI);
});
"""


@pytest.fixture
def watched(page: Any) -> tuple[Any, list[str]]:
    """The page, and a list that collects every CSP complaint it makes."""
    complaints: list[str] = []
    page.add_init_script(RECORD_VIOLATIONS)
    page.on(
        "console",
        lambda m: complaints.append(m.text) if "Content Security Policy" in m.text else None,
    )
    page.on("pageerror", lambda e: complaints.append(f"page error: {e}"))
    return page, complaints


def visit(page: Any, complaints: list[str], url: str) -> None:
    response = page.goto(url)
    assert response.status == 200, url
    assert response.headers.get("content-security-policy"), url
    page.wait_for_load_state("networkidle")
    complaints.extend(page.evaluate("window.__cspViolations"))
    assert complaints == [], f"{url}: {complaints}"


def test_admin_pages_run_under_the_policy_without_a_violation(live_server, watched):
    page, complaints = watched
    NamespaceFactory(name="acme.orders")
    root = make_admin("root", superuser=True)
    key = EntityKey("acme.orders", "order", "o-1")
    first = changeset_apply(
        store=baseline, actor=root, ops=[PutOp(key, {"status": "placed"})], rpc=Rpc.PUT_ENTITY
    ).changeset
    changeset_apply(
        store=baseline, actor=root, ops=[PutOp(key, {"status": "paid"})], rpc=Rpc.PUT_ENTITY
    )
    latest = Changeset.objects.exclude(pk=first.pk).get()
    UserFactory(username="alice")
    base = live_server.url

    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "root")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")
    for url in (
        "/admin/",
        "/admin/changesets/changeset/",
        f"/admin/changesets/changeset/{latest.pk}/change/",
        f"/admin/changesets/changeset/{latest.pk}/revert/",
        "/admin/changesets/revision/entity/acme.orders/order/o-1/",
        f"/admin/changesets/revision/entity/acme.orders/order/o-1/as-of/{first.pk}/",
        "/admin/entities/namespace/",
        "/admin/atlas/apitoken/",
        "/admin/atlas/apitoken/add/",
    ):
        visit(page, complaints, base + url)

    # The add form's user lookup opens a popup window and fills the field from it.
    with page.expect_popup() as popup_info:
        page.click("#lookup_id_user")
    popup = popup_info.value
    popup.wait_for_load_state("networkidle")
    popup.click("text=alice")
    page.fill("#id_name", "browser")
    page.click("input[name=_save]")
    page.wait_for_selector("#api-token-key")
    assert page.inner_text("#api-token-key").startswith("atlas_")
    complaints.extend(page.evaluate("window.__cspViolations"))
    assert complaints == []


def test_swagger_ui_renders_under_the_policy_without_a_violation(live_server, watched):
    page, complaints = watched
    visit(page, complaints, f"{live_server.url}/api/docs/")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "Atlas API" in page.inner_text(".swagger-ui .info .title")
    page.wait_for_selector(".opblock-tag")  # the operations, from /api/schema/
    complaints.extend(page.evaluate("window.__cspViolations"))
    assert complaints == []
