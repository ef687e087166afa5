"""The entities admin: entity list/search/detail (read-only, scoped) and namespace roles."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from atlas.admin_mixins import EstimatedCountPaginator
from entities import access
from entities.models import Entity, Namespace
from tests.changesets.test_admin import NS, SECRET, logged_in, make_admin, put
from tests.entities.factories import NamespaceFactory, UserFactory

pytestmark = pytest.mark.django_db

LIST = "/admin/entities/entity/"
NAMESPACES = "/admin/entities/namespace/"


@pytest.fixture
def root(db):
    NamespaceFactory(name=NS)
    NamespaceFactory(name=SECRET)
    return make_admin("root", superuser=True)


@pytest.fixture
def auditor(root):
    return make_admin("audrey", reader=[NS])


def entity(path: str) -> Entity:
    ns, kind, slug = path.split("/")
    return Entity.objects.get(namespace_id=ns, kind=kind, slug=slug)


def test_entity_list_is_read_only_and_scoped(root, auditor):
    put(root, (f"{NS}/order/a", {"n": 1}), (f"{SECRET}/doc/x", {"n": 1}))
    client = logged_in(auditor)
    response = client.get(LIST)
    assert response.status_code == 200
    assert [e.slug for e in response.context["cl"].result_list] == ["a"]
    assert SECRET not in response.content.decode()
    assert client.get(f"{LIST}add/").status_code == 403
    hidden = entity(f"{SECRET}/doc/x")
    assert client.get(f"{LIST}{hidden.pk}/change/").status_code == 302  # "doesn't exist"
    assert client.get(f"{LIST}{hidden.pk}/history/").status_code == 404


def test_entity_search_is_exact_by_slug_or_key(root):
    put(
        root,
        (f"{NS}/order/a", {"n": 1}),
        (f"{NS}/invoice/a", {"n": 1}),
        (f"{SECRET}/doc/a", {"n": 1}),
        (f"{NS}/order/ab", {"n": 1}),
    )
    client = logged_in(root)

    def found(q: str) -> set[str]:
        result = client.get(LIST, {"q": q}).context["cl"].result_list
        return {f"{e.namespace_id}/{e.kind}/{e.slug}" for e in result}

    assert found("a") == {f"{NS}/order/a", f"{NS}/invoice/a", f"{SECRET}/doc/a"}
    assert found(f"{NS}/order/a") == {f"{NS}/order/a"}
    assert found("zzz") == set()
    assert found("bad slug!") == set()


def test_restricted_search_never_finds_unreadable_entities(root, auditor):
    put(root, (f"{NS}/order/a", {"n": 1}), (f"{SECRET}/doc/a", {"n": 1}))
    result = logged_in(auditor).get(LIST, {"q": "a"}).context["cl"].result_list
    assert [e.namespace_id for e in result] == [NS]
    result = logged_in(auditor).get(LIST, {"q": f"{SECRET}/doc/a"}).context["cl"].result_list
    assert list(result) == []


def test_entity_page_shows_content_and_links_to_its_history(root):
    cs = put(root, (f"{NS}/order/a", {"title": "Placed"}))
    client = logged_in(root)
    obj = entity(f"{NS}/order/a")
    page = client.get(f"{LIST}{obj.pk}/change/").content.decode()
    assert "&quot;title&quot;: &quot;Placed&quot;" in page
    assert "/admin/changesets/revision/entity/acme.orders/order/a/" in page
    assert f"/admin/changesets/changeset/{cs.pk}/change/" in page
    assert 'name="_save"' not in page
    history = client.get(f"{LIST}{obj.pk}/history/")
    assert history.status_code == 302
    assert history.url == "/admin/changesets/revision/entity/acme.orders/order/a/"


def test_namespace_filter_lists_only_readable_namespaces(root, auditor):
    page = logged_in(auditor).get(LIST).content.decode()
    assert f"?namespace={NS}" in page and SECRET not in page


# --- namespaces and roles -----------------------------------------------------------------


def test_superuser_grants_and_revokes_whole_roles(root):
    alice = UserFactory(username="alice")
    client = logged_in(root)
    url = f"{NAMESPACES}{NS}/roles/"
    response = client.post(url, {"principal_type": "user", "principal": "alice", "role": "writer"})
    assert response.status_code == 302
    alice = type(alice).objects.get(pk=alice.pk)
    assert access.role_in(alice, NS) == access.Role.WRITER
    page = client.get(url).content.decode()
    assert "alice" in page and "writer" in page
    client.post(url, {"principal_type": "user", "principal": "alice", "role": "none"})
    alice = type(alice).objects.get(pk=alice.pk)
    assert access.role_in(alice, NS) == access.Role.NONE


def test_groups_get_roles_too(root):
    group = Group.objects.create(name="auditors")
    member = UserFactory(username="mo")
    member.groups.add(group)
    logged_in(root).post(
        f"{NAMESPACES}{NS}/roles/",
        {"principal_type": "group", "principal": "auditors", "role": "reader"},
    )
    assert access.role_in(type(member).objects.get(pk=member.pk), NS) == access.Role.READER


def test_granting_to_an_unknown_principal_is_a_form_error(root):
    response = logged_in(root).post(
        f"{NAMESPACES}{NS}/roles/",
        {"principal_type": "user", "principal": "nobody", "role": "reader"},
    )
    assert response.status_code == 200
    assert "No user named" in response.content.decode()


def test_non_superuser_staff_cannot_manage_namespaces(root, auditor):
    client = logged_in(auditor)
    assert client.get(NAMESPACES).status_code == 403
    assert client.get(f"{NAMESPACES}{NS}/roles/").status_code == 403
    response = client.post(
        f"{NAMESPACES}{NS}/roles/",
        {"principal_type": "user", "principal": "audrey", "role": "maintainer"},
    )
    assert response.status_code == 403
    # One role engine: the API gives the staff auditor what the admin does, her reader grant.
    assert access.role_in(type(auditor).objects.get(pk=auditor.pk), NS) == access.Role.READER


def test_namespace_add_goes_through_the_service_and_validates(root):
    client = logged_in(root)
    response = client.post(f"{NAMESPACES}add/", {"name": "acme.new", "protected": "on"})
    assert response.status_code == 302
    assert Namespace.objects.get(name="acme.new").protected
    bad = client.post(f"{NAMESPACES}add/", {"name": "Not Valid"})
    assert bad.status_code == 200 and not Namespace.objects.filter(name="Not Valid").exists()
    change = client.post(f"{NAMESPACES}acme.new/change/", {"protected": ""})
    assert change.status_code == 302
    assert not Namespace.objects.get(name="acme.new").protected
    assert client.post(f"{NAMESPACES}acme.new/delete/").status_code == 403


def test_past_the_exact_limit_the_entity_count_is_an_estimate(root, monkeypatch):
    # Moved from the changeset list, which pages by key now and counts nothing.
    monkeypatch.setattr(EstimatedCountPaginator, "exact_up_to", 2)
    for n in range(4):
        put(root, (f"{NS}/order/e{n}", {"n": n}))
    response = logged_in(root).get(LIST)
    assert response.context["cl"].paginator.estimated
    assert b"about" in response.content
