"""Query parameters and shared body fields described once (issue 14).

Each list endpoint's filters are one ``atlas.api.strict.Query`` serializer that
both validates them and is the OpenAPI description. The answers asserted here
are the ones these endpoints gave before the serializers (hand-written checks):
status, problem type, ``detail``, top-level ``pointer`` (or its absence) and
``errors``, exactly.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from django.http import QueryDict
from rest_framework import serializers

from atlas.api import strict
from atlas.api.errors import PROBLEM_JSON
from atlas.exceptions import ValidationFailed
from changesets.models import Changeset
from entities import validation as v

pytestmark = pytest.mark.django_db

API = "/api/v1"
NS = "acme.orders"
MSG_NS = v.MSG_NAMESPACE
MSG_CAPTURE = "One of new_values, new_row, old_and_new_values."
VALIDATION = "https://atlas.dev/problems/validation-failed"


def err(pointer: str, detail: str) -> dict[str, str]:
    return {"pointer": pointer, "detail": detail}


def assert_422(response: Any, detail: str, pointer: str | None, errors: list[dict]) -> None:
    assert response.status_code == 422, response.content
    assert response["Content-Type"] == PROBLEM_JSON
    body = response.json()
    assert body["type"] == VALIDATION
    assert body["detail"] == detail
    assert body.get("pointer") == pointer
    assert body["errors"] == errors


@pytest.fixture
def api(client_for, staff):
    return client_for(staff)


# --- GET /changes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "detail", "pointer", "errors"),
    [
        ({"capture": "all"}, MSG_CAPTURE, "/capture", [err("/capture", MSG_CAPTURE)]),
        (
            {"namespace": ["Not Valid", "", NS, "Also Bad"]},
            "2 errors.",
            "/namespace",
            [err("/namespace", MSG_NS), err("/namespace", MSG_NS)],
        ),
        (
            {"namespace": "Bad", "capture": "x"},
            "2 errors.",
            "/capture",
            [err("/capture", MSG_CAPTURE), err("/namespace", MSG_NS)],
        ),
        ({"limit": "0"}, "limit must be at least 1.", None, [err("/limit", "Must be at least 1.")]),
        (
            {"limit": "ten"},
            "limit must be an integer.",
            None,
            [err("/limit", "Must be an integer.")],
        ),
        # The limit was checked last and at once: its answer alone.
        (
            {"limit": "-1", "capture": "x", "namespace": "Bad"},
            "limit must be at least 1.",
            None,
            [err("/limit", "Must be at least 1.")],
        ),
        (
            {"cursor": "x", "capture": "x"},
            "Unknown query parameter(s): cursor.",
            None,
            [err("/cursor", "Unknown parameter.")],
        ),
        # Every 422 before the cursor's 400.
        (
            {"since": "forged", "capture": "x"},
            MSG_CAPTURE,
            "/capture",
            [err("/capture", MSG_CAPTURE)],
        ),
    ],
    ids=[
        "capture",
        "namespaces",
        "capture-and-namespace",
        "limit-zero",
        "limit-text",
        "limit-first",
        "unknown-first",
        "422-before-400",
    ],
)
def test_feed_query_errors(api, params, detail, pointer, errors):
    assert_422(api.get(f"{API}/changes", params), detail, pointer, errors)


def test_feed_query_empty_values_are_absent_and_limit_is_clamped(api, namespace, staff, write):
    write(staff, f"{NS}/order/a", {"n": 1})
    body = api.get(f"{API}/changes", {"since": "", "capture": "", "namespace": "", "limit": ""})
    assert body.status_code == 200, body.content
    assert body.json()["capture"] == "new_values"
    assert len(body.json()["records"]) == 1
    assert api.get(f"{API}/changes", {"limit": "5000", "capture": "new_row"}).status_code == 200


def test_feed_bad_cursor_is_400_at_since(api):
    response = api.get(f"{API}/changes", {"since": "forged", "limit": "3"})
    assert response.status_code == 400
    assert response.json()["pointer"] == "/since"


# --- GET /branches -------------------------------------------------------------------------


def test_branch_status_filter_errors(api):
    assert_422(
        api.get(f"{API}/branches", {"status": "closed"}),
        "status must be one of open, merged, abandoned.",
        None,
        [err("/status", "One of open, merged, abandoned.")],
    )
    assert api.get(f"{API}/branches", {"status": ""}).status_code == 200  # empty = absent


# --- GET /entities -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "detail", "pointer", "errors"),
    [
        (
            {"slug_prefix": "x" * 201, "kind": "BAD", "namespace": "Acme"},
            "3 errors.",
            "/namespace",
            [
                err("/namespace", MSG_NS),
                err("/kind", v.MSG_KIND),
                err("/slug_prefix", "At most 200 characters, no NUL."),
            ],
        ),
        (
            {"slug_prefix": "a\x00"},
            "At most 200 characters, no NUL.",
            "/slug_prefix",
            [err("/slug_prefix", "At most 200 characters, no NUL.")],
        ),
    ],
    ids=["all-three", "nul"],
)
def test_entity_list_filter_errors(api, params, detail, pointer, errors):
    assert_422(api.get(f"{API}/entities", params), detail, pointer, errors)


def test_entity_list_filters_empty_is_absent(api, namespace, staff, write):
    write(staff, f"{NS}/order/a", {"n": 1})
    response = api.get(f"{API}/entities", {"namespace": "", "kind": "", "slug_prefix": ""})
    assert response.status_code == 200, response.content
    assert [e["slug"] for e in response.json()["results"]] == ["a"]
    filtered = api.get(f"{API}/entities", {"namespace": NS, "kind": "order", "slug_prefix": "b"})
    assert filtered.json()["results"] == []


def test_page_size_keeps_its_answer(api):
    assert_422(
        api.get(f"{API}/entities", {"page_size": "x"}),
        "page_size must be an integer.",
        None,
        [err("/page_size", "Must be an integer.")],
    )


# --- the Query base ------------------------------------------------------------------------


class _Sample(strict.Query):
    many = strict.CheckedListField(child=serializers.CharField(), clean=list, required=False)
    one = strict.QueryIntField(maximum=10, default=3)
    word = strict.QueryChoiceField(["b", "a"], required=False)


def test_query_reads_repeatable_values_defaults_and_names():
    params = QueryDict("many=x&many=&many=y&one=50&word=a&word=b")
    assert strict.validated(_Sample, params) == {"many": ["x", "y"], "one": 10, "word": "b"}
    assert strict.validated(_Sample, QueryDict("many=&one=")) == {"one": 3}
    assert _Sample.names() == {"many", "one", "word"}


def test_query_reports_every_error_in_declaration_order():
    with pytest.raises(ValidationFailed) as caught:
        strict.validated(_Sample, QueryDict("word=c&one=0"))
    assert caught.value.errors == [err("/one", "Must be at least 1."), err("/word", "One of b, a.")]


# --- the OpenAPI document ------------------------------------------------------------------


@pytest.fixture(scope="module")
def schema(django_db_setup, django_db_blocker) -> dict[str, Any]:
    from django.test import Client

    with django_db_blocker.unblock():
        return yaml.safe_load(Client().get("/api/schema/").content)


def params_of(schema: dict[str, Any], path: str) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in schema["paths"][path]["get"]["parameters"]}


def test_schema_describes_the_feed_query(schema):
    params = params_of(schema, "/api/v1/changes")
    assert set(params) == {"since", "capture", "namespace", "limit"}
    assert params["since"]["schema"] == {"type": "string"}
    assert params["capture"]["schema"] == {
        "type": "string",
        "enum": ["new_row", "new_values", "old_and_new_values"],
        "default": "new_values",
    }
    namespace = params["namespace"]
    assert namespace["schema"]["type"] == "array"
    assert "minLength" not in namespace["schema"]["items"]
    assert namespace["schema"]["items"]["pattern"]
    assert (namespace["style"], namespace["explode"]) == ("form", True)
    assert params["limit"]["schema"] == {"type": "integer", "minimum": 1, "default": 100}
    assert all(p["in"] == "query" and p.get("allowEmptyValue") for p in params.values())


def test_schema_describes_the_list_filters(schema):
    status = params_of(schema, "/api/v1/branches")["status"]
    assert status["schema"] == {"type": "string", "enum": ["abandoned", "merged", "open"]}
    entities = params_of(schema, "/api/v1/entities")
    assert entities["slug_prefix"]["schema"] == {
        "type": "string",
        "maxLength": 200,
        "pattern": strict.NO_NUL,
    }
    for name in ("namespace", "kind"):
        assert "minLength" not in entities[name]["schema"]
        assert entities[name]["schema"]["pattern"]
    rpc = params_of(schema, "/api/v1/changesets")["rpc"]
    assert "PutEntity" in rpc["schema"]["enum"]


def test_schema_comment_is_one_description_everywhere(schema):
    components = schema["components"]["schemas"]
    comments = {
        name: component["properties"]["comment"]
        for name, component in components.items()
        if name.endswith("Request") and "comment" in component.get("properties", {})
    }
    assert {"BranchCreateRequest", "RevertBodyRequest", "PutBodyRequest"} <= set(comments)
    assert len({repr(sorted(c.items())) for c in comments.values()}) == 1
    assert next(iter(comments.values()))["nullable"] is True


# --- the shared comment field: null reads as "" -------------------------------------------


def test_a_null_comment_is_an_empty_one(api, namespace, staff, write):
    created = api.post(f"{API}/branches", {"name": "f", "comment": None}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["comment"] == ""
    merged = api.post(f"{API}/branches/f/merge", {"comment": None}, format="json")
    assert merged.status_code == 200, merged.content

    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    reverted = api.post(f"{API}/changesets/{changeset.id}/revert", {"comment": None}, format="json")
    assert reverted.status_code == 200, reverted.content
    assert Changeset.objects.order_by("-seq").first().comment == ""
    put = api.put(f"{API}/entities/{NS}/order/b", {"content": {}, "comment": None}, format="json")
    assert put.status_code == 201, put.content
    assert Changeset.objects.order_by("-seq").first().comment == ""
