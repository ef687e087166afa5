"""The branches admin: read-only, scoped, with a diff summary against baseline."""

from __future__ import annotations

import pytest

from branches.models import Branch
from branches.services import branch_member_add
from tests.changesets.test_admin import NS, SECRET, logged_in, make_admin, put
from tests.entities.factories import NamespaceFactory

pytestmark = pytest.mark.django_db

LIST = "/admin/branches/branch/"


@pytest.fixture
def root(db):
    NamespaceFactory(name=NS)
    NamespaceFactory(name=SECRET)
    return make_admin("root", superuser=True)


@pytest.fixture
def feature(root, make_branch, bwrite) -> Branch:
    put(root, (f"{NS}/order/a", {"n": 1}), (f"{NS}/order/b", {"n": 1}))
    branch = make_branch(root, "feature")
    bwrite(root, branch, f"{NS}/order/a", {"n": 2})
    bwrite(root, branch, f"{NS}/order/c", {"n": 1})
    bwrite(root, branch, f"{SECRET}/doc/x", {"n": 1})
    put(root, (f"{NS}/order/b", {"n": 2}))  # baseline moves on
    return Branch.objects.get(pk=branch.pk)


def test_branch_list_and_detail_with_diff_summary(root, feature):
    client = logged_in(root)
    listing = client.get(LIST)
    assert listing.status_code == 200 and "feature" in listing.content.decode()
    page = client.get(f"{LIST}{feature.pk}/change/").content.decode()
    assert 'name="_save"' not in page
    assert "moved <strong>1</strong> changeset since the fork" in page
    assert "<strong>3</strong> changesets of its own" in page
    assert "<strong>3</strong> entities" in page
    assert "order/c" in page and "branch=feature" in page
    assert client.get(f"{LIST}add/").status_code == 403
    assert client.post(f"{LIST}{feature.pk}/delete/").status_code == 403


def test_restricted_staff_sees_branches_and_diffs_only_in_readable_namespaces(root, feature):
    auditor = make_admin("audrey", reader=[NS])
    outsider = make_admin("olga", reader=["acme.other"])
    client = logged_in(auditor)
    page = client.get(f"{LIST}{feature.pk}/change/").content.decode()
    assert "order/c" in page and "doc/x" not in page and SECRET not in page
    assert "<strong>2</strong> entities" in page
    assert "feature" in client.get(LIST).content.decode()
    other = logged_in(outsider)
    assert other.get(LIST).context["cl"].result_count == 0
    assert other.get(f"{LIST}{feature.pk}/change/").status_code == 302  # "doesn't exist"


def test_overlay_rows_are_scoped(root, feature):
    auditor = make_admin("audrey", reader=[NS])
    response = logged_in(auditor).get("/admin/branches/branchentity/")
    assert {row.namespace_id for row in response.context["cl"].result_list} == {NS}


def test_members_see_the_branch_and_its_member_list_in_the_admin(root, feature):
    member = make_admin("mia", reader=["acme.other"])
    assert logged_in(member).get(LIST).context["cl"].result_count == 0
    branch_member_add(branch=feature, user=member, actor=root)
    client = logged_in(member)
    assert client.get(LIST).context["cl"].result_count == 1
    page = client.get(f"{LIST}{feature.pk}/change/").content.decode()
    assert "mia" in page and SECRET not in page
