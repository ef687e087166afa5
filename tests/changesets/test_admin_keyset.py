"""Keyset paging and complete search in the log's admin changelists (issue 18).

Pages are read by position (``?before=`` / ``?after=``), never by OFFSET, and
nothing is counted; walking "older" from the newest page visits every row
once, in order, whatever the filters. Search by entity is driven from the
revision history index a bounded number of candidates at a time, and every
match is reachable (nothing truncated), also when filters reject most
candidates and a page stops early. Pages are small here (monkeypatched) so
that a few dozen changesets make many pages.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext

from changesets.admin import search
from changesets.models import Changeset, JournalEntry, Revision, Rpc
from changesets.outbox import journal
from tests.changesets.test_admin import CORE, NS, SECRET, logged_in, make_admin, put

pytestmark = pytest.mark.django_db

LIST = "/admin/changesets/changeset/"
REVISIONS = "/admin/changesets/revision/"
JOURNAL = "/admin/changesets/journalentry/"


@pytest.fixture
def small_pages(monkeypatch):
    for model in (Changeset, Revision, JournalEntry):
        monkeypatch.setattr(admin.site._registry[model], "list_per_page", 3)


@pytest.fixture(params=["one partition", "partitions of 3 seqs"])
def log_layout(request, db):
    """The search reads a partition at a time, newest first (``search.candidates``):
    on the standard layout the whole log is one partition; on partitions of three
    seqs a page spans many, and the windows after the first two are read at once."""
    if request.param != "one partition":
        from changesets import partitions
        from tests.changesets.partition_helpers import layout

        # 50 partitions cover every test's writes (at most about 30 changesets). Each
        # partition is some 22 relations a test's transaction locks to the end: 200 of
        # them took 4,400 of the server's 6,400 lock slots (64 a connection), and two
        # such tests on two workers at once ran out of shared memory.
        layout(partitions.missing(0, 150, [], step=3))
    return request.param


@pytest.fixture
def root(db):
    from tests.entities.factories import NamespaceFactory

    NamespaceFactory(name=NS)
    NamespaceFactory(name=SECRET)
    NamespaceFactory(name=CORE)
    return make_admin("root", superuser=True)


def link(response: Any, cls: str) -> str | None:
    """The href of the paginator's ``cls`` link (``older``, ``newer``, ``newest``)."""
    html = response.content.decode()
    found = re.search(r'<p class="paginator">(.*?)</p>', html, re.S)
    assert found, "no paginator"
    for href, text in re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', found.group(1)):
        if cls in text:
            return href.replace("&amp;", "&")
    return None


def walk(client: Any, url: str, params: dict[str, str] | None = None) -> list[list[Any]]:
    """Every page from the newest, following "older" to the end: the rows of each."""
    response = client.get(url, params or {})
    assert response.status_code == 200
    pages = [list(response.context["cl"].result_list)]
    for _ in range(200):
        older = link(response, "older")
        if older is None:
            return pages
        response = client.get(url + older)
        assert response.status_code == 200
        pages.append(list(response.context["cl"].result_list))
    raise AssertionError("older never ended")


def test_older_pages_visit_every_changeset_once_newest_first_without_offset(root, small_pages):
    made = [put(root, (f"{NS}/order/k{n}", {"n": n})) for n in range(10)]
    client = logged_in(root)
    with CaptureQueriesContext(connection) as queries:
        pages = walk(client, LIST)
    seqs = [c.seq for page in pages for c in page]
    assert seqs == sorted((c.seq for c in made), reverse=True)
    assert [len(p) for p in pages] == [3, 3, 3, 1]
    sql = [q["sql"].upper() for q in queries if "changesets_changeset" in q["sql"]]
    assert not [s for s in sql if "OFFSET" in s or "COUNT(" in s]


def test_newer_goes_back_and_newest_returns_to_the_top(root, small_pages):
    made = [put(root, (f"{NS}/order/k{n}", {"n": n})) for n in range(8)]
    client = logged_in(root)
    first = client.get(LIST)
    assert link(first, "newer") is None and link(first, "newest") is None
    second = client.get(LIST + link(first, "older"))
    third = client.get(LIST + link(second, "older"))
    back = client.get(LIST + link(third, "newer"))
    assert [c.seq for c in back.context["cl"].result_list] == [
        c.seq for c in second.context["cl"].result_list
    ]
    top = client.get(LIST + link(third, "newest"))
    assert [c.seq for c in top.context["cl"].result_list] == [c.seq for c in made[::-1][:3]]


def test_filters_hold_across_pages(root, small_pages):
    reverts = []
    for n in range(9):
        rpc = Rpc.REVERT_CHANGESET if n % 2 else Rpc.PUT_ENTITY
        cs = put(root, (f"{NS}/order/k{n}", {"n": n}), rpc=rpc)
        if n % 2:
            reverts.append(cs.seq)
    pages = walk(logged_in(root), LIST, {"rpc__exact": Rpc.REVERT_CHANGESET})
    assert [c.seq for p in pages for c in p] == reverts[::-1]


def test_a_malformed_position_is_the_newest_page(root, small_pages):
    made = [put(root, (f"{NS}/order/k{n}", {"n": n})) for n in range(4)]
    client = logged_in(root)
    for bad in ("x", "1.2", "-3", "9" * 30):
        response = client.get(LIST, {"before": bad})
        assert response.status_code == 200, bad
        assert response.context["cl"].result_list[0].seq == made[-1].seq


def test_search_by_a_busy_slug_reaches_every_changeset(log_layout, root, small_pages, monkeypatch):
    monkeypatch.setattr(search, "CHUNK", 4)
    monkeypatch.setattr(search, "MAX_CANDIDATES", 8)  # pages stop early and resume
    touched = []
    for n in range(14):
        touched.append(put(root, (f"{NS}/order/busy", {"n": n})).seq)
        put(root, (f"{NS}/order/other{n}", {"n": n}))
        if n % 3 == 0:  # the slug in a second namespace, in its own and in a shared changeset
            touched.append(put(root, (f"{SECRET}/doc/busy", {"n": n})).seq)
    pages = walk(logged_in(root), LIST, {"q": "busy"})
    assert [c.seq for p in pages for c in p] == sorted(touched, reverse=True)


def test_search_with_a_filter_that_rejects_most_candidates_is_complete(
    log_layout, root, small_pages, monkeypatch
):
    monkeypatch.setattr(search, "CHUNK", 3)
    monkeypatch.setattr(search, "MAX_CANDIDATES", 6)
    wanted = []
    for n in range(20):
        rpc = Rpc.REVERT_CHANGESET if n % 7 == 0 else Rpc.PUT_ENTITY
        cs = put(root, (f"{NS}/order/busy", {"n": n}), rpc=rpc)
        if rpc == Rpc.REVERT_CHANGESET:
            wanted.append(cs.seq)
    pages = walk(logged_in(root), LIST, {"q": "busy", "rpc__exact": Rpc.REVERT_CHANGESET})
    assert [c.seq for p in pages for c in p] == wanted[::-1]


def test_scoped_search_is_complete_and_sees_only_readable_namespaces(
    log_layout, root, small_pages, monkeypatch
):
    monkeypatch.setattr(search, "CHUNK", 2)
    auditor = make_admin("audrey", reader=[NS])
    mine = []
    for n in range(7):
        mine.append(put(root, (f"{NS}/order/busy", {"n": n})).seq)
        put(root, (f"{SECRET}/doc/busy", {"n": n}))
    pages = walk(logged_in(auditor), LIST, {"q": "busy"})
    assert [c.seq for p in pages for c in p] == mine[::-1]


def test_revision_pages_break_seq_ties_by_id(log_layout, root, small_pages, monkeypatch):
    monkeypatch.setattr(search, "CHUNK", 2)
    for n in range(3):  # four revisions per changeset: seq ties inside every page
        put(root, *[(f"{NS}/order/k{i}", {"n": n}) for i in range(4)])
    expected = list(Revision.objects.order_by("-seq", "-id").values_list("id", flat=True))
    pages = walk(logged_in(root), REVISIONS)
    assert [r.id for p in pages for r in p] == expected
    searched = walk(logged_in(root), REVISIONS, {"q": "k2"})
    assert [r.id for p in searched for r in p] == list(
        Revision.objects.filter(slug="k2").order_by("-seq", "-id").values_list("id", flat=True)
    )


def test_journal_pages_outstanding_entries_by_seq(root, small_pages):
    made = [put(root, (f"{NS}/order/k{n}", {"n": n})) for n in range(8)]
    journal.publish([made[2].id])  # published: deleted, so not listed
    JournalEntry.objects.filter(pk=made[5].id).update(phase="published")  # an old release's
    client = logged_in(root)
    pages = walk(client, JOURNAL)
    listed = [e.seq for p in pages for e in p]
    assert listed == [c.seq for c in made[::-1] if c not in (made[2], made[5])]


def test_scoped_staff_type_author_and_branch_and_see_no_names_they_cannot_read(root):
    put(root, (f"{SECRET}/doc/x", {"n": 1}))
    auditor = make_admin("audrey", reader=[NS])
    writer = make_admin("walt", writer=[NS])
    mine = put(writer, (f"{NS}/order/a", {"n": 1}))
    client = logged_in(auditor)
    page = client.get(LIST).content.decode()
    assert 'name="author"' in page and 'name="branch"' in page and 'name="until"' in page
    assert "?author=root" not in page  # no list of authors for a scoped user
    found = client.get(LIST, {"author": "walt"}).context["cl"].result_list
    assert [c.pk for c in found] == [mine.pk]
    assert list(client.get(LIST, {"author": "root"}).context["cl"].result_list) == []
    listed = logged_in(root).get(LIST).content.decode()
    assert "?author=root" in listed and "?author=walt" in listed  # superusers get the list


def test_a_scoped_namespace_filter_shows_exactly_that_namespace_and_only_on_the_list(root):
    mixed = put(root, (f"{NS}/order/a", {"n": 1}), (f"{SECRET}/doc/x", {"n": 1}))
    put(root, (f"{SECRET}/doc/y", {"n": 1}))
    other = put(root, (f"{CORE}/rule/r", {"n": 1}))
    auditor = make_admin("audrey", reader=[NS, CORE])
    client = logged_in(auditor)
    found = client.get(LIST, {"namespace": NS}).context["cl"].result_list
    assert [c.pk for c in found] == [mixed.pk]
    assert [c.pk for c in client.get(LIST, {"namespace": CORE}).context["cl"].result_list] == [
        other.pk
    ]
    assert list(client.get(LIST, {"namespace": SECRET}).context["cl"].result_list) == []
    hidden = Changeset.objects.get(namespaces=[SECRET])
    # The namespace parameter narrows the changelist only: never a detail page's scope.
    assert client.get(f"{LIST}{hidden.pk}/change/", {"namespace": NS}).status_code == 404


def test_branch_filter_lists_baseline_and_branches_and_pages_each(root, small_pages):
    """``changeset_branch_seq`` holds branch changesets only (migration 0028): the
    choices still name baseline and every branch, and each filter pages completely."""
    from branches.services import branch_create
    from branches.store import BranchStore
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from tests.changesets.test_admin import key

    stores = [BranchStore(branch_create(name=n, actor=root)) for n in ("feature", "hotfix")]
    made: dict[str, list[int]] = {"": [], "feature": [], "hotfix": []}
    for n in range(14):
        if n % 3 == 2:
            ops = [PutOp(key(f"{NS}/order/b{n}"), {"n": n})]
            cs = changeset_apply(store=stores[n % 2], actor=root, ops=ops, rpc=Rpc.PUT_ENTITY)
            made[cs.changeset.branch].append(cs.changeset.seq)
        else:
            made[""].append(put(root, (f"{NS}/order/k{n}", {"n": n})).seq)
    client = logged_in(root)
    page = client.get(LIST).content.decode()
    for choice in ("?branch=~baseline", "?branch=feature", "?branch=hotfix"):
        assert choice in page
    for name, value in (("", "~baseline"), ("feature", "feature"), ("hotfix", "hotfix")):
        pages = walk(client, LIST, {"branch": value})
        assert [c.seq for p in pages for c in p] == made[name][::-1], name
