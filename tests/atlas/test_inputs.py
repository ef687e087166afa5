"""Input hardening (API.md "Limits and visibility (added)"): a malformed ``If-Match``
is 422, a name made only of dots is refused (422 in bodies, 404 in paths), and
``as_of_time`` copied from a changeset's displayed ``at`` includes that changeset.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from atlas.api.conditional import IF_MATCH_PATTERN
from atlas.api.render import rfc3339
from changesets import chain
from changesets.models import Changeset, LogHead, Revision
from changesets.selectors.log import previous_hash
from entities.models import Entity
from tests.atlas.test_errors import assert_problem
from tests.entities.factories import UserFactory

API = "/api/v1"
NS = "acme.orders"
ENTITY = f"{API}/entities/{NS}/event/order.placed"
IF_MATCH_POINTER = "/headers/If-Match"


@pytest.fixture
def root(db):
    return UserFactory(username="root", is_superuser=True, is_staff=True)


@pytest.fixture
def api(client_for, writer):
    return client_for(writer)


@pytest.fixture
def existing(write, writer):
    """``acme.orders/event/order.placed`` at version 1."""
    return write(writer, f"{NS}/event/order.placed", {"title": "Order placed"})


def send(api: Any, method: str, if_match: str) -> Any:
    headers = {"If-Match": if_match}
    if method == "put":
        return api.put(ENTITY, {"content": {"title": "v2"}}, format="json", headers=headers)
    if method == "patch":
        return api.patch(ENTITY, {"patch": {"title": "v2"}}, format="json", headers=headers)
    return api.delete(ENTITY, headers=headers)


# --- If-Match ------------------------------------------------------------------------------

MALFORMED_IF_MATCH = [
    "1",
    '""',
    '"abc"',
    "W/",
    "**",
    '"1"junk',
    "",
    "   ",
    ",",
    '"1" "2"',
    '*, "1"',
    'W/"1',
    '"-1"',
    '"01"',
    '"1.0"',
    'w/"1"',
    "'1'",
    "garbage",
]


@pytest.mark.parametrize("if_match", MALFORMED_IF_MATCH)
@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_a_malformed_if_match_is_422_with_a_header_pointer(api, existing, method, if_match):
    body = assert_problem(
        send(api, method, if_match),
        422,
        pointer=IF_MATCH_POINTER,
        error_pointers=[IF_MATCH_POINTER],
    )
    assert "malformed if-match" in body["detail"].lower()
    if "-1" not in if_match:
        assert "-1" not in json.dumps(body)
    assert Changeset.objects.count() == 1


@pytest.mark.parametrize("if_match", ["1", '"abc"', ""])
def test_a_malformed_if_match_on_a_missing_entity_is_422_not_412(api, namespace, if_match):
    response = api.put(ENTITY, {"content": {"a": 1}}, format="json", headers={"If-Match": if_match})
    assert_problem(response, 422, pointer=IF_MATCH_POINTER)
    assert not Changeset.objects.exists()


@pytest.mark.parametrize(
    "if_match",
    ['"7", "1"', '"1","2"', 'W/"9" ,\t"1"', '"2", W/"1"', ', "1",', '"1",, "3"', ' "1" ', "\t*"],
)
def test_a_list_of_entity_tags_matches_when_any_of_them_does(api, existing, if_match):
    response = send(api, "put", if_match)
    assert response.status_code == 200, response.content
    assert response.json()["entity"]["version"] == 2


def test_a_list_of_entity_tags_none_of_which_matches_is_412_naming_them(api, existing):
    body = assert_problem(send(api, "put", '"7", W/"0", "12"'), 412)
    assert body["detail"].endswith("is at version 1, not 7, 0 or 12.")
    assert "(" not in body["detail"]


def test_a_well_formed_tag_that_never_matches_is_412_without_internal_values(api, existing):
    body = assert_problem(send(api, "delete", '"0"'), 412)
    assert "-1" not in body["detail"]
    assert body["detail"].endswith("is at version 1, not 0.")


def test_batch_if_match_in_bodies_keeps_its_integer_or_star_rule(api, existing):
    op = {"op": "put", "namespace": NS, "kind": "event", "slug": "order.placed", "content": {}}
    response = api.post(f"{API}/batch", {"ops": [{**op, "if_match": '"1"'}]}, format="json")
    assert_problem(response, 422, error_pointers=["/ops/0/if_match"])
    response = api.post(f"{API}/batch", {"ops": [{**op, "if_match": 1}]}, format="json")
    assert response.status_code == 200, response.content


def test_the_server_grammar_accepts_exactly_the_documented_forms():
    """One regex decides: the forms API.md lists pass, the malformed ones do not."""
    pattern = re.compile(IF_MATCH_PATTERN)
    for value in ('"1"', 'W/"2"', "*", '"1", W/"2"', '"0"', ' "3" ,, "4", '):
        assert pattern.fullmatch(value), value
    assert not any(pattern.fullmatch(value) for value in MALFORMED_IF_MATCH)


# --- names made only of dots -------------------------------------------------------------

DOTS = [".", "..", "..."]


def batch_op(**fields: Any) -> dict[str, Any]:
    return {"op": "put", "namespace": NS, "kind": "event", "slug": "x", "content": {}, **fields}


@pytest.mark.parametrize("value", DOTS)
@pytest.mark.parametrize("field", ["namespace", "kind", "slug"])
@pytest.mark.parametrize("op_name", ["put", "patch", "delete"])
def test_a_batch_name_made_only_of_dots_is_422(api, namespace, field, value, op_name):
    op = batch_op(op=op_name, **{field: value})
    op.pop("content")
    if op_name == "put":
        op["content"] = {}
    if op_name == "patch":
        op["patch"] = {}
    response = api.post(f"{API}/batch", {"ops": [op]}, format="json")
    assert_problem(response, 422, error_pointers=[f"/ops/0/{field}"])
    assert not Changeset.objects.exists()


@pytest.mark.parametrize("value", DOTS)
@pytest.mark.parametrize("field", ["namespace", "kind"])
def test_a_delete_by_query_name_made_only_of_dots_is_422(api, namespace, field, value):
    body = {"namespace": NS, field: value}
    response = api.post(f"{API}/delete-by-query", body, format="json")
    assert_problem(response, 422, error_pointers=[f"/{field}"])


@pytest.mark.parametrize("value", DOTS)
def test_a_namespace_made_only_of_dots_cannot_be_created(root, client_for, value):
    response = client_for(root).post(f"{API}/namespaces", {"name": value}, format="json")
    assert_problem(response, 422, error_pointers=["/name"])


@pytest.mark.parametrize("value", DOTS)
def test_a_subscription_namespace_made_only_of_dots_is_422(root, client_for, settings, value):
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    body = {"name": "hook", "url": "http://127.0.0.1:9/hook", "namespaces": [value]}
    response = client_for(root).post(f"{API}/subscriptions", body, format="json")
    assert_problem(response, 422, error_pointers=["/namespaces/0"])


@pytest.mark.parametrize("value", DOTS)
@pytest.mark.parametrize("field", ["namespace", "kind", "slug"])
def test_an_imported_name_made_only_of_dots_fails_the_file_at_its_line(
    root, client_for, namespace, field, value
):
    """Import keeps its strict-file rule (API.md): a bad op line is 400 at that line."""
    envelope = {
        "schema_version": 1,
        "changeset_id": "0193a1c2-0000-7000-8000-000000000000",
        "author": "someone",
        "at": "2026-01-02T03:04:05.678Z",
        "rpc": "BatchMutate",
        "branch": "",
        "comment": "",
    }
    op = {"op": "create", "namespace": NS, "kind": "event", "slug": "x", "before": None}
    op = {**op, "after": {"v": 1}, field: value}
    text = json.dumps(envelope) + "\n" + json.dumps(op) + "\n"
    response = client_for(root).post(
        f"{API}/changesets/import", data=text, content_type="application/x-ndjson"
    )
    assert_problem(response, 400, pointer="/line/2")
    assert not Changeset.objects.exists()


@pytest.mark.parametrize(
    "path",
    [
        f"{NS}/event/.",
        f"{NS}/event/..",
        f"{NS}/event/...",
        f"{NS}/./x",
        f"{NS}/../x",
        "./event/x",
        "../event/x",
    ],
)
@pytest.mark.parametrize("method", ["get", "put", "patch", "delete", "history"])
def test_a_path_name_made_only_of_dots_is_404(api, namespace, path, method):
    url = f"{API}/entities/{path}"
    if method == "history":
        response = api.get(url + "/history")
    elif method == "put":
        response = api.put(url, {"content": {}}, format="json")
    elif method == "patch":
        response = api.patch(url, {"patch": {}}, format="json")
    else:
        response = getattr(api, method)(url)
    assert_problem(response, 404)
    assert not Changeset.objects.exists()


@pytest.mark.parametrize("value", [".", ".."])
def test_a_namespace_path_made_only_of_dots_is_404(root, client_for, value):
    assert_problem(client_for(root).get(f"{API}/namespaces/{value}"), 404)


def test_slugs_with_dots_among_other_characters_stay_valid(api, namespace):
    for slug in (".a", "a..", "..a..", "order.placed", "-.", "_"):
        response = api.put(f"{API}/entities/{NS}/event/{slug}", {"content": {}}, format="json")
        assert response.status_code == 201, (slug, response.content)


def test_a_dots_only_entity_written_before_the_rule_can_still_be_deleted_by_query(
    api, write, writer
):
    """The write service takes any key (imports and reverts replay old ones); the API
    refuses new dots-only names, and delete-by-query's prefix still reaches old ones."""
    write(writer, f"{NS}/event/..", {"old": True})
    response = api.post(
        f"{API}/delete-by-query", {"namespace": NS, "slug_prefix": "."}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["deleted"] == 1
    assert not Entity.objects.exists()


# --- as_of_time at the displayed precision -------------------------------------------------


def test_as_of_time_copied_from_a_write_response_includes_that_write(api, namespace):
    written = api.put(ENTITY, {"content": {"title": "first"}}, format="json").json()
    at = written["changeset"]["at"]
    response = api.get(ENTITY, {"as_of_time": at})
    assert response.status_code == 200, response.content
    assert response.json()["as_of"]["changeset_id"] == written["changeset"]["id"]
    assert response.json()["content"] == {"title": "first"}
    listed = api.get(f"{API}/entities", {"as_of_time": at}).json()
    assert listed["as_of"]["changeset_id"] == written["changeset"]["id"]
    assert [e["slug"] for e in listed["results"]] == ["order.placed"]


def test_as_of_time_one_millisecond_before_a_write_excludes_it(api, namespace, existing):
    written = api.put(ENTITY, {"content": {"title": "second"}}, format="json").json()
    at = Changeset.objects.get(pk=written["changeset"]["id"]).at
    before = rfc3339(at - timedelta(milliseconds=1))
    response = api.get(ENTITY, {"as_of_time": before})
    assert response.status_code == 200, response.content
    assert response.json()["content"] == {"title": "Order placed"}


def test_changeset_at_is_stored_at_millisecond_precision(api, namespace):
    for n in range(5):
        body = api.put(ENTITY, {"content": {"n": n}}, format="json").json()
        changeset = Changeset.objects.get(pk=body["changeset"]["id"])
        assert changeset.at.microsecond % 1000 == 0
        assert rfc3339(changeset.at) == body["changeset"]["at"]
        assert {r.at for r in Revision.objects.filter(changeset=changeset)} == {changeset.at}
        entity = Entity.objects.get()
        assert entity.updated_at == changeset.at
    assert LogHead.objects.get(pk=1).at.microsecond % 1000 == 0


def _give_the_newest_changeset_microseconds(extra_us: int) -> Changeset:
    """Make the newest changeset look written before the millisecond rule: its ``at``
    (and its revisions', and the log head's) gains ``extra_us`` microseconds, and its
    hash is recomputed, as the old write path would have hashed it."""
    newest = Changeset.objects.order_by("-seq").first()
    assert newest is not None
    at = newest.at + timedelta(microseconds=extra_us)
    newest.at = at
    revisions = list(Revision.objects.filter(changeset=newest).order_by("id"))
    new_hash = chain.changeset_hash(
        prev_hash=previous_hash(newest),
        changeset=newest,
        revisions_hex=chain.revisions_digest(revisions),
    )
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE changesets_changeset DISABLE TRIGGER changeset_append_only")
        cursor.execute("ALTER TABLE changesets_revision DISABLE TRIGGER revision_append_only")
        cursor.execute(
            "UPDATE changesets_changeset SET at = %s, hash = decode(%s, 'hex') WHERE id = %s",
            [at, new_hash, newest.id],
        )
        cursor.execute(
            "UPDATE changesets_revision SET at = %s WHERE changeset_id = %s", [at, newest.id]
        )
        cursor.execute(
            "UPDATE changesets_loghead SET at = %s, hash = decode(%s, 'hex') WHERE id = 1",
            [at, new_hash],
        )
        cursor.execute("ALTER TABLE changesets_changeset ENABLE TRIGGER changeset_append_only")
        cursor.execute("ALTER TABLE changesets_revision ENABLE TRIGGER revision_append_only")
    return Changeset.objects.get(pk=newest.pk)


def _verify() -> chain.Break | None:
    def pairs():
        for changeset in Changeset.objects.order_by("seq"):
            yield changeset, list(Revision.objects.filter(changeset=changeset).order_by("id"))

    return chain.verify(pairs(), head=LogHead.objects.get(pk=1))[1]


def test_an_old_changeset_with_microseconds_is_found_at_its_displayed_time(api, namespace):
    api.put(ENTITY, {"content": {"title": "old"}}, format="json")
    old = _give_the_newest_changeset_microseconds(999)
    assert old.at.microsecond % 1000 == 999
    assert _verify() is None
    shown = rfc3339(old.at)
    response = api.get(ENTITY, {"as_of_time": shown})
    assert response.status_code == 200, response.content
    assert response.json()["as_of"]["changeset_id"] == str(old.id)
    assert response.json()["as_of"]["at"] == shown


def test_changesets_until_and_since_a_displayed_at_include_that_changeset(api, namespace):
    api.put(ENTITY, {"content": {"title": "old"}}, format="json")
    old = _give_the_newest_changeset_microseconds(999)
    shown = rfc3339(old.at)
    for bound in ("until", "since"):
        listed = api.get(f"{API}/changesets", {bound: shown}).json()["results"]
        assert [c["id"] for c in listed] == [str(old.id)], bound


def test_new_changesets_chain_on_from_old_microsecond_rows_and_verify(api, namespace):
    api.put(ENTITY, {"content": {"title": "old"}}, format="json")
    old = _give_the_newest_changeset_microseconds(456)
    body = api.put(ENTITY, {"content": {"title": "new"}}, format="json").json()
    new = Changeset.objects.get(pk=body["changeset"]["id"])
    assert previous_hash(new) == old.hash
    assert new.at.microsecond % 1000 == 0
    # Never backwards at the precision responses show.
    assert rfc3339(new.at) >= rfc3339(old.at)
    assert _verify() is None
    response = api.get(ENTITY, {"as_of_time": body["changeset"]["at"]})
    assert response.json()["as_of"]["changeset_id"] == str(new.id)
