"""The changeset admin: list, search, filters, detail with diffs, revert, entity history.

Who sees what (docs/admin.md): superusers see everything; any other admin
user needs Django's view permission for a page and sees only rows in the
namespaces their grants let them read; ``is_staff`` alone grants no
namespace. Everything goes through Django's test client with a logged-in
session, like a browser.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from changesets.models import Changeset, JournalEntry, Rpc, Subscription
from changesets.ops import PutOp
from changesets.outbox import journal
from changesets.services.apply import changeset_apply
from entities import access
from entities.models import Entity
from entities.services import role_grant
from entities.store import baseline
from tests.changesets.helpers import assert_nothing_written, key, log_snapshot
from tests.entities.factories import NamespaceFactory, UserFactory

pytestmark = pytest.mark.django_db

NS, SECRET, CORE = "acme.orders", "acme.secret", "acme.core"
LIST = "/admin/changesets/changeset/"
VIEW_PERMS = (
    "view_changeset",
    "view_revision",
    "view_journalentry",
    "view_subscription",
    "view_entity",
    "view_branch",
    "view_branchentity",
)


def detail_url(changeset: Changeset) -> str:
    return f"{LIST}{changeset.pk}/change/"


def revert_url(changeset: Changeset) -> str:
    return f"{LIST}{changeset.pk}/revert/"


def history_url(path: str) -> str:
    return f"/admin/changesets/revision/entity/{path}/"


def make_admin(username: str, *, superuser: bool = False, **roles: list[str]) -> Any:
    """A staff user with the admin's view permissions and the given namespace roles."""
    user = UserFactory(username=username, is_staff=True, is_superuser=superuser)
    user.set_password("pw-for-tests-only")
    user.save()
    user.user_permissions.add(*Permission.objects.filter(codename__in=VIEW_PERMS))
    for role, names in roles.items():
        for name in names:
            role_grant(namespace=NamespaceFactory(name=name), principal=user, role=role)
    return user


def logged_in(user: Any, **kw: Any) -> Client:
    client = Client(**kw)
    client.force_login(user)
    return client


def put(actor: Any, *paths_and_contents: tuple[str, dict | None], rpc: str = Rpc.BATCH_MUTATE):
    from changesets.ops import DeleteOp

    ops = [PutOp(key(p), c) if c is not None else DeleteOp(key(p)) for p, c in paths_and_contents]
    return changeset_apply(store=baseline, actor=actor, ops=ops, rpc=rpc).changeset


def rows(response: Any) -> list[str]:
    """The changelist's result rows as text, one per row."""
    html = response.content.decode()
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in html else ""
    return [re.sub(r"<[^>]+>", " ", r) for r in body.split("<tr")[1:]]


@pytest.fixture
def root(db):
    NamespaceFactory(name=NS)
    NamespaceFactory(name=SECRET)
    NamespaceFactory(name=CORE, protected=True)
    return make_admin("root", superuser=True)


@pytest.fixture
def auditor(root):
    """Staff, not superuser: reader of acme.orders only."""
    return make_admin("audrey", reader=[NS])


@pytest.fixture
def editor(root):
    """Staff, not superuser: writer of acme.orders only."""
    return make_admin("eddie", writer=[NS])


# --- read-only --------------------------------------------------------------------------


def test_nobody_can_add_change_or_delete_changesets_in_the_admin(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    client = logged_in(root)
    assert client.get(f"{LIST}add/").status_code == 403
    page = client.get(detail_url(cs))
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert client.post(f"{LIST}{cs.pk}/delete/").status_code == 403
    assert Changeset.objects.filter(pk=cs.pk).exists()


def test_staff_without_view_permission_gets_403(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    bare = UserFactory(username="bare", is_staff=True)
    client = logged_in(bare)
    assert client.get(LIST).status_code == 403
    assert client.get(detail_url(cs)).status_code == 403


# --- changelist -----------------------------------------------------------------------------


def test_changelist_shows_id_time_author_rpc_branch_ops_and_namespaces(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}), (f"{SECRET}/doc/x", {"s": 1}))
    response = logged_in(root).get(LIST)
    assert response.status_code == 200
    (row,) = rows(response)
    for text in (f"#{cs.seq}", str(cs.id), "root", "BatchMutate", "2", NS, SECRET, "committed"):
        assert text in row


def test_changelist_is_newest_first_and_never_counts(root):
    for n in range(3):
        put(root, (f"{NS}/order/a", {"n": n}))
    with CaptureQueriesContext(connection) as queries:
        response = logged_in(root).get(LIST)
    seqs = [int(m) for m in re.findall(r"#(\d+)", " ".join(rows(response)))]
    assert seqs == sorted(seqs, reverse=True) and len(seqs) == 3
    log_reads = [q["sql"].upper() for q in queries if "changesets_changeset" in q["sql"]]
    assert not [sql for sql in log_reads if "COUNT(" in sql], "keyset pages count nothing"
    assert not [sql for sql in log_reads if "OFFSET" in sql]
    assert not any("DISTINCT" in sql and "MIN(" in sql for sql in log_reads), (
        "filters and dates must not scan for distinct values"
    )


def test_filters_by_author_rpc_branch_and_namespace(root, editor):
    a = put(root, (f"{NS}/order/a", {"n": 1}), rpc=Rpc.PUT_ENTITY)
    b = put(editor, (f"{NS}/order/b", {"n": 1}))
    c = put(root, (f"{SECRET}/doc/x", {"n": 1}))
    client = logged_in(root)

    def ids(query: str) -> set[str]:
        response = client.get(f"{LIST}?{query}")
        assert response.status_code == 200, query
        return {str(o.pk) for o in response.context["cl"].result_list}

    assert ids("author=eddie") == {str(b.pk)}
    assert ids("rpc__exact=PutEntity") == {str(a.pk)}
    assert ids("branch=~baseline") == {str(a.pk), str(b.pk), str(c.pk)}
    assert ids(f"namespace={SECRET}") == {str(c.pk)}
    day = a.at.astimezone(timezone.get_current_timezone()).date()
    assert ids(f"until={day.isoformat()}") == {str(a.pk), str(b.pk), str(c.pk)}
    assert ids(f"until={(day - timedelta(days=1)).isoformat()}") == set()
    assert ids("until=not-a-day") == set()
    page = client.get(LIST).content.decode()
    assert "?author=eddie" in page and f"?namespace={SECRET}" in page


def test_search_by_slug_finds_each_changeset_once(root):
    first = put(root, (f"{NS}/order/a", {"n": 1}), (f"{SECRET}/doc/a", {"n": 1}))
    second = put(root, (f"{NS}/order/a", {"n": 2}))
    put(root, (f"{NS}/order/b", {"n": 1}))
    response = logged_in(root).get(LIST, {"q": "a"})
    found = [str(o.pk) for o in response.context["cl"].result_list]
    assert found == [str(second.pk), str(first.pk)]  # newest first, no duplicates


def test_search_by_key_by_id_and_by_seq(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    other = put(root, (f"{NS}/invoice/a", {"n": 1}))
    client = logged_in(root)

    def found(q: str) -> list[str]:
        return [str(o.pk) for o in client.get(LIST, {"q": q}).context["cl"].result_list]

    assert found(f"{NS}/order/a") == [str(cs.pk)]
    assert found(str(other.pk)) == [str(other.pk)]
    assert found(f"#{cs.seq}") == [str(cs.pk)]
    assert found("no-such-slug") == []
    assert found("not a slug!") == []
    assert found(str(uuid.uuid4())) == []


# --- namespace isolation ------------------------------------------------------------------


def test_restricted_staff_sees_only_changesets_with_a_readable_namespace(root, auditor):
    mixed = put(root, (f"{NS}/order/a", {"n": 1}), (f"{SECRET}/doc/x", {"s": 1}))
    hidden = put(root, (f"{SECRET}/doc/y", {"s": 1}))
    client = logged_in(auditor)
    response = client.get(LIST)
    assert [o.pk for o in response.context["cl"].result_list] == [mixed.pk]
    page = response.content.decode()
    assert SECRET not in page  # neither in the namespaces column nor in the filter
    assert client.get(LIST, {"namespace": SECRET}).context["cl"].result_count == 0
    assert client.get(LIST, {"q": "y"}).context["cl"].result_count == 0
    assert client.get(LIST, {"q": "x"}).context["cl"].result_count == 0
    assert client.get(detail_url(hidden)).status_code == 404
    assert client.get(revert_url(hidden)).status_code == 404


def test_is_staff_alone_reads_nothing_in_the_admin_nor_in_the_api(root):
    put(root, (f"{NS}/order/a", {"n": 1}))
    staff = make_admin("stella")
    assert access.role_in(staff, NS) == access.Role.NONE  # one role engine for both
    response = logged_in(staff).get(LIST)
    assert response.status_code == 200
    assert response.context["cl"].result_count == 0


def test_detail_shows_only_readable_ops(root, auditor):
    mixed = put(root, (f"{NS}/order/a", {"n": 1}), (f"{SECRET}/doc/x", {"s": 1}))
    page = logged_in(auditor).get(detail_url(mixed)).content.decode()
    assert f"{NS}/order/a" in page
    assert "doc/x" not in page and SECRET not in page
    assert "1 you cannot read" in page


# --- detail -----------------------------------------------------------------------------------


def test_detail_shows_ops_with_a_marked_side_by_side_diff_and_links(root):
    put(root, (f"{NS}/order/a", {"title": "Draft", "lines": [{"sku": "x", "qty": 1}], "same": 1}))
    cs = put(
        root,
        (f"{NS}/order/a", {"title": "Final", "lines": [{"sku": "x", "qty": 2}], "same": 1}),
        (f"{NS}/order/new", {"n": 1}),
    )
    page = logged_in(root).get(detail_url(cs)).content.decode()
    assert 'data-key="title" data-status="changed"' in page
    assert 'data-key="lines" data-status="changed"' in page
    assert 'data-key="same" data-status="same"' in page
    assert 'data-key="n" data-status="added"' in page
    # nested values are pretty JSON, the changed line marked
    assert re.search(r"<span class=\"atlas-line atlas-ins\">\s*&quot;qty&quot;: 2,</span>", page)
    assert re.search(r"<span class=\"atlas-line\">\s*&quot;sku&quot;: &quot;x&quot;</span>", page)
    assert history_url(f"{NS}/order/a") in page
    assert f"/as-of/{cs.pk}/" in page
    assert "journal-status" in page and "published" in page


def test_detail_of_a_branch_changeset_has_no_journal_and_no_revert(root):
    from branches.services import branch_create
    from branches.store import BranchStore

    branch = branch_create(name="feature", actor=root)
    cs = changeset_apply(
        store=BranchStore(branch),
        actor=root,
        ops=[PutOp(key(f"{NS}/order/a"), {"n": 1})],
        rpc=Rpc.PUT_ENTITY,
    ).changeset
    client = logged_in(root)
    page = client.get(detail_url(cs)).content.decode()
    assert "branch changesets reach subscribers when their branch is merged" in page
    assert 'id="revert-button"' not in page
    assert "branch=feature" in page  # history links stay on the branch
    response = client.get(revert_url(cs))
    assert response.status_code == 302 and response.url == detail_url(cs)


def test_journal_errors_are_shown(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    JournalEntry.objects.filter(pk=cs.pk).update(
        phase="committed", attempts=3, failures=2, last_error="hook exploded"
    )
    page = logged_in(root).get(detail_url(cs)).content.decode()
    assert "committed" in page and "hook exploded" in page and "(2 failed)" in page


def test_a_published_changeset_shows_published_though_its_entry_is_gone(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    client = logged_in(root)
    assert 'atlas-phase-committed">committed' in client.get(detail_url(cs)).content.decode()
    assert journal.journal_publish(changeset_id=cs.pk) == journal.PUBLISHED

    page = client.get(detail_url(cs)).content.decode()
    assert 'atlas-phase-published">published' in page
    assert "a published entry leaves the journal" in page
    changelist = client.get(LIST).context["cl"]
    row = next(c for c in changelist.result_list if c.pk == cs.pk)
    assert changelist.model_admin.journal_label(row) == "published"


def test_unknown_or_malformed_changeset_is_404(root):
    client = logged_in(root)
    assert client.get(f"{LIST}{uuid.uuid4()}/change/").status_code == 404
    assert client.get(f"{LIST}not-a-uuid/change/").status_code == 404


def test_ops_are_paged(root, monkeypatch):
    from changesets.admin import pages

    monkeypatch.setattr(pages, "OPS_PER_PAGE", 2)
    cs = put(root, *[(f"{NS}/order/o{i}", {"i": i}) for i in range(5)])
    client = logged_in(root)
    first = client.get(detail_url(cs)).content.decode()
    assert "page 1 of 3" in first and "order/o0" in first and "order/o4" not in first
    last = client.get(detail_url(cs), {"page": 3}).content.decode()
    assert "order/o4" in last and "order/o0" not in last


# --- the revert button ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("who", "shown"),
    [("root", True), ("editor", True), ("auditor", False)],
)
def test_revert_button_needs_write_on_every_namespace(request, root, who, shown):
    user = request.getfixturevalue(who) if who != "root" else root
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    page = logged_in(user).get(detail_url(cs)).content.decode()
    assert ('id="revert-button"' in page) is shown


def test_revert_button_absent_when_one_namespace_is_not_writable(root):
    half = make_admin("half", writer=[NS], reader=[SECRET])
    cs = put(root, (f"{NS}/order/a", {"n": 1}), (f"{SECRET}/doc/x", {"n": 1}))
    client = logged_in(half)
    assert 'id="revert-button"' not in client.get(detail_url(cs)).content.decode()
    assert client.get(revert_url(cs)).status_code == 403


def test_protected_baseline_needs_a_maintainer_to_revert(root):
    writer = make_admin("wes", writer=[CORE])
    maintainer = make_admin("maya", maintainer=[CORE])
    cs = put(root, (f"{CORE}/rule/r", {"n": 1}))
    assert 'id="revert-button"' not in logged_in(writer).get(detail_url(cs)).content.decode()
    assert 'id="revert-button"' in logged_in(maintainer).get(detail_url(cs)).content.decode()


# --- revert: preview and confirm ----------------------------------------------------------


def plan_token(page: str) -> str:
    match = re.search(r'name="plan" value="([^"]+)"', page)
    assert match, "the preview offers a confirm form"
    return match.group(1)


def test_preview_is_a_dry_run_that_explains_the_inverse_ops(root, editor):
    put(root, (f"{NS}/order/a", {"title": "Draft"}))
    cs = put(root, (f"{NS}/order/a", {"title": "Final"}), (f"{NS}/order/new", {"n": 1}))
    before = log_snapshot()
    response = logged_in(editor).get(revert_url(cs))
    assert response.status_code == 200
    page = response.content.decode()
    assert_nothing_written(before)
    assert 'data-revert-state="ready"' in page
    assert "will write 2 ops" in page
    assert "Put back its content from before" in page
    assert f"Delete it: changeset #{cs.seq} created it." in page
    assert 'data-key="title" data-status="changed"' in page
    assert "csrfmiddlewaretoken" in page and plan_token(page)


def test_confirm_reverts_as_the_logged_in_user_and_shows_the_new_changeset(root, editor):
    put(root, (f"{NS}/order/a", {"title": "Draft"}))
    cs = put(root, (f"{NS}/order/a", {"title": "Final"}))
    client = logged_in(editor)
    token = plan_token(client.get(revert_url(cs)).content.decode())
    response = client.post(revert_url(cs), {"plan": token, "comment": "undo the rename"})
    new = Changeset.objects.order_by("-seq").first()
    assert new.rpc == Rpc.REVERT_CHANGESET and new.seq == cs.seq + 1
    assert new.author_id == editor.pk and new.author_name == "eddie"
    assert new.comment == "undo the rename"
    assert response.status_code == 302 and response.url == detail_url(new)
    assert Entity.objects.get(slug="a").content == {"title": "Draft"}
    followed = client.get(response.url)
    assert f"Reverted changeset #{cs.seq} as changeset #{new.seq}" in followed.content.decode()


def test_confirm_without_a_previewed_plan_writes_nothing(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    client = logged_in(root)
    before = log_snapshot()
    for data in ({}, {"plan": "forged"}, {"plan": "a:b:c"}):
        response = client.post(revert_url(cs), data)
        assert response.status_code == 302 and response.url == revert_url(cs)
    assert_nothing_written(before)


def test_a_plan_token_is_bound_to_its_user_and_changeset(root, editor):
    one = put(root, (f"{NS}/order/a", {"n": 1}))
    two = put(root, (f"{NS}/order/b", {"n": 1}))
    token = plan_token(logged_in(root).get(revert_url(one)).content.decode())
    before = log_snapshot()
    logged_in(editor).post(revert_url(one), {"plan": token})
    logged_in(root).post(revert_url(two), {"plan": token})
    assert_nothing_written(before)


def test_confirm_refuses_when_the_plan_changed_since_the_preview(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}), (f"{NS}/order/b", {"n": 1}))
    client = logged_in(root)
    token = plan_token(client.get(revert_url(cs)).content.decode())
    # b goes back to its pre-image (absent) on its own: still revertible, but a different plan
    put(root, (f"{NS}/order/b", None))
    before = log_snapshot()
    response = client.post(revert_url(cs), {"plan": token})
    assert response.status_code == 302 and response.url == revert_url(cs)
    assert_nothing_written(before)
    again = client.get(response.url).content.decode()
    assert "changed since your preview" in again
    assert "will write 1 op" in again and "Already back as before, so skipped" in again


def test_preview_explains_conflicts_and_offers_no_confirm(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    newer = put(root, (f"{NS}/order/a", {"n": 2}))
    page = logged_in(root).get(revert_url(cs)).content.decode()
    assert 'data-revert-state="conflict"' in page
    assert "was changed again by changeset" in page and f"#{newer.seq}" in page
    assert f"Revert #{newer.seq} first" in page
    assert 'name="plan"' not in page


def test_confirm_refuses_after_a_conflicting_change(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    client = logged_in(root)
    token = plan_token(client.get(revert_url(cs)).content.decode())
    put(root, (f"{NS}/order/a", {"n": 2}))
    before = log_snapshot()
    response = client.post(revert_url(cs), {"plan": token})
    assert response.url == revert_url(cs)
    assert_nothing_written(before)


def test_nothing_to_revert_is_said_plainly(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    put(root, (f"{NS}/order/a", None))
    page = logged_in(root).get(revert_url(cs)).content.decode()
    assert 'data-revert-state="nothing"' in page and 'name="plan"' not in page


def test_readers_cannot_preview_or_confirm(root, auditor):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    token = plan_token(logged_in(root).get(revert_url(cs)).content.decode())
    client = logged_in(auditor)
    before = log_snapshot()
    assert client.get(revert_url(cs)).status_code == 403
    assert client.post(revert_url(cs), {"plan": token}).status_code == 403
    assert_nothing_written(before)


def test_confirm_needs_the_csrf_token(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    client = logged_in(root, enforce_csrf_checks=True)
    token = plan_token(client.get(revert_url(cs)).content.decode())
    before = log_snapshot()
    assert client.post(revert_url(cs), {"plan": token}).status_code == 403
    assert_nothing_written(before)


def test_overlong_comment_is_refused(root):
    cs = put(root, (f"{NS}/order/a", {"n": 1}))
    client = logged_in(root)
    token = plan_token(client.get(revert_url(cs)).content.decode())
    before = log_snapshot()
    response = client.post(revert_url(cs), {"plan": token, "comment": "x" * 10_001})
    assert response.status_code == 200 and b"at most 10,000" in response.content
    assert_nothing_written(before)


# --- entity history and as-of -------------------------------------------------------------


def test_entity_history_is_a_timeline_with_diffs_and_as_of_links(root, editor):
    one = put(root, (f"{NS}/order/a", {"title": "Draft"}), rpc=Rpc.PUT_ENTITY)
    two = put(editor, (f"{NS}/order/a", {"title": "Final", "paid": True}))
    response = logged_in(root).get(history_url(f"{NS}/order/a"))
    assert response.status_code == 200
    page = response.content.decode()
    assert page.index(f"changeset #{two.seq}") < page.index(f"changeset #{one.seq}")
    assert "eddie" in page and "root" in page and "PutEntity" in page and "BatchMutate" in page
    assert 'data-key="paid" data-status="added"' in page
    assert f"/as-of/{one.pk}/" in page and f"/as-of/{two.pk}/" in page
    assert "/admin/entities/entity/" in page  # link to the live entity


def test_entity_history_pages_older_changes(root, monkeypatch):
    from changesets.admin import pages

    monkeypatch.setattr(pages, "HISTORY_PER_PAGE", 2)
    made = [put(root, (f"{NS}/order/a", {"n": n})) for n in range(3)]
    client = logged_in(root)
    page = client.get(history_url(f"{NS}/order/a")).content.decode()
    assert f"#{made[0].seq}" not in page
    older = re.search(r'href="(\?before=\d+)" id="older-link"', page).group(1)
    page = client.get(history_url(f"{NS}/order/a") + older.replace("&amp;", "&")).content.decode()
    assert f"changeset #{made[0].seq}" in page


def test_entity_history_of_a_deleted_entity_still_shows(root):
    put(root, (f"{NS}/order/a", {"n": 1}))
    put(root, (f"{NS}/order/a", None))
    page = logged_in(root).get(history_url(f"{NS}/order/a")).content.decode()
    assert "does not exist now" in page


def test_entity_history_is_404_for_unreadable_or_unknown(root, auditor):
    put(root, (f"{SECRET}/doc/x", {"n": 1}))
    assert logged_in(auditor).get(history_url(f"{SECRET}/doc/x")).status_code == 404
    assert logged_in(root).get(history_url(f"{NS}/order/none")).status_code == 404


def test_as_of_shows_the_entity_right_after_that_changeset(root):
    one = put(root, (f"{NS}/order/a", {"title": "Draft"}))
    put(root, (f"{NS}/order/a", {"title": "Final"}))
    gone = put(root, (f"{NS}/order/a", None))
    client = logged_in(root)
    page = client.get(f"{history_url(f'{NS}/order/a')}as-of/{one.pk}/").content.decode()
    assert "&quot;title&quot;: &quot;Draft&quot;" in page and "Final" not in page
    absent = client.get(f"{history_url(f'{NS}/order/a')}as-of/{gone.pk}/").content.decode()
    assert 'id="as-of-absent"' in absent


def test_as_of_is_404_for_a_changeset_the_user_cannot_see(root, auditor):
    put(root, (f"{NS}/order/a", {"n": 1}))
    hidden = put(root, (f"{SECRET}/doc/x", {"n": 1}))
    url = f"{history_url(f'{NS}/order/a')}as-of/{hidden.pk}/"
    assert logged_in(auditor).get(url).status_code == 404
    assert logged_in(root).get(url).status_code == 200


# --- revisions, journal, subscriptions ------------------------------------------------------


def test_revision_list_and_detail_are_scoped_and_searchable(root, auditor):
    put(root, (f"{NS}/order/a", {"n": 1}), (f"{SECRET}/doc/a", {"n": 1}))
    client = logged_in(auditor)
    response = client.get("/admin/changesets/revision/", {"q": "a"})
    assert [r.namespace for r in response.context["cl"].result_list] == [NS]
    rev = response.context["cl"].result_list[0]
    page = client.get(f"/admin/changesets/revision/{rev.pk}/change/").content.decode()
    assert "(history)" in page and "&quot;n&quot;: 1" in page


def test_journal_entries_are_listed_for_readable_changesets(root, auditor):
    put(root, (f"{NS}/order/a", {"n": 1}))
    put(root, (f"{SECRET}/doc/x", {"n": 1}))
    response = logged_in(auditor).get("/admin/changesets/journalentry/")
    assert response.status_code == 200
    assert response.context["cl"].result_count == 1
    journal.publish(list(JournalEntry.objects.values_list("pk", flat=True)))
    response = logged_in(root).get("/admin/changesets/journalentry/")
    assert response.context["cl"].result_count == 0  # published entries are gone


def test_subscriptions_show_status_and_lag_but_never_the_secret(root, auditor):
    sub = Subscription.objects.create(
        name="billing-sync",
        url="https://example.invalid/hook",
        namespaces=[NS],
        secret="s3cr3t-hmac-key",
        consecutive_failures=2,
        last_error="HTTP 500 from hook",
    )
    Subscription.objects.create(name="everything", url="https://example.invalid/all", secret="k")
    put(root, (f"{NS}/order/a", {"n": 1}))
    client = logged_in(root)
    listing = client.get("/admin/changesets/subscription/")
    page = listing.content.decode()
    assert "billing-sync" in page and "failing (2 in a row" in page and "HTTP 500" in page
    assert listing.context["cl"].result_count == 2
    detail = client.get(f"/admin/changesets/subscription/{sub.pk}/change/").content.decode()
    assert "s3cr3t-hmac-key" not in detail and "HTTP 500 from hook" in detail
    assert client.get("/admin/changesets/subscription/add/").status_code == 403
    # restricted: only subscriptions confined to readable namespaces
    scoped = logged_in(auditor).get("/admin/changesets/subscription/")
    assert [s.name for s in scoped.context["cl"].result_list] == ["billing-sync"]
