"""Bad input answers RFC 9457 problem+json with the status API.md fixes, never a 500.

API.md "Conventions" (Errors) and "Decisions that close open points" (status
codes for bad input). ``assert_problem`` is the shared assertion for every
error response in the API tests.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

import pytest
from django.db import OperationalError
from django.test import override_settings
from rest_framework.exceptions import ValidationError

from atlas.api.errors import flatten_errors, problem_for
from changesets.models import Changeset
from entities.api import views

API = "/api/v1"
ENTITY = f"{API}/entities/acme.orders/event/order.placed"
PROBLEM_JSON = "application/problem+json"
PROBLEM_FIELDS = {"type", "title", "status", "detail", "instance"}


def assert_problem(
    response: Any,
    status: int,
    *,
    pointer: str | None = None,
    error_pointers: list[str] | None = None,
) -> dict[str, Any]:
    """Assert ``response`` is a problem+json document for ``status`` and return its body.

    Checks the contract every error shares: the media type, the five RFC 9457
    members, ``status`` equal to the HTTP status, ``instance`` naming the
    request, no template leftovers and no stack trace. A 422 must carry
    ``errors`` as ``{pointer, detail}`` pairs.
    """
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM_JSON
    text = response.content.decode()
    assert "Traceback" not in text
    body = json.loads(text)
    assert body.keys() >= PROBLEM_FIELDS, body
    assert body["status"] == status
    assert body["type"].startswith("https://")
    assert body["title"] and "{" not in body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    path = response.request["PATH_INFO"]
    assert unquote(body["instance"].split("?")[0]) == unquote(path)
    if status == 422:
        assert body["errors"], body
        for item in body["errors"]:
            assert set(item) == {"pointer", "detail"}
            assert item["pointer"].startswith("/") and item["detail"]
    if pointer is not None:
        assert body.get("pointer") == pointer, body
    if error_pointers is not None:
        assert [e["pointer"] for e in body["errors"]] == error_pointers, body
    return body


def op(name: str = "put", slug: str = "x", **fields: Any) -> dict[str, Any]:
    """A batch op on ``acme.orders/event/<slug>``; ``fields`` override or add members."""
    base = {"op": name, "namespace": "acme.orders", "kind": "event", "slug": slug}
    if name == "put":
        base["content"] = {"title": slug}
    if name == "patch":
        base["patch"] = {"title": slug}
    return {**base, **fields}


@pytest.fixture
def api(client_for, writer):
    return client_for(writer)


def raw_put(api, body: str | bytes, path: str = ENTITY, content_type: str = "application/json"):
    return api.put(path, data=body, content_type=content_type)


# --- 400: malformed JSON ---------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        '{"content": {"a": 1}',
        '{"content": {"a": 1},}',
        "{'content': {}}",
        '{"content": {"a": NaN}}',
        '{"content": {"a": Infinity}}',
        '{"content": {"a": -Infinity}}',
        b'{"content": {"a": "\xff"}}',
        "",
    ],
    ids=[
        "truncated",
        "trailing-comma",
        "single-quotes",
        "nan",
        "infinity",
        "minus-infinity",
        "not-utf8",
        "empty",
    ],
)
def test_malformed_json_is_400(api, body):
    response = raw_put(api, body)
    if body == "":
        # An empty body is well-formed "nothing": the missing object is a 422.
        assert_problem(response, 422)
    else:
        assert_problem(response, 400)
    assert not Changeset.objects.exists()


def test_json_nested_past_the_parser_limit_is_400_not_500(api):
    body = '{"content": ' + "[" * 5000 + "]" * 5000 + "}"
    assert_problem(raw_put(api, body), 400)


# --- 422: well-formed but invalid --------------------------------------------------


@pytest.mark.parametrize("body", [[], "text", 5, None, [{"content": {}}]])
def test_non_object_body_is_422(api, body):
    response = raw_put(api, json.dumps(body))
    assert_problem(response, 422, error_pointers=["/"])


@pytest.mark.parametrize("content", [[], "text", 5, None, True])
def test_content_that_is_not_an_object_is_422(api, content):
    response = api.put(ENTITY, {"content": content}, format="json")
    assert_problem(response, 422, error_pointers=["/content"])


def test_unknown_body_field_is_422(api):
    response = api.put(ENTITY, {"content": {}, "colour": "red"}, format="json")
    assert_problem(response, 422, error_pointers=["/colour"])


def test_missing_content_is_422(api):
    response = api.put(ENTITY, {"comment": "no content"}, format="json")
    assert_problem(response, 422, error_pointers=["/content"])


def test_patch_that_is_not_an_object_is_422(api, write, writer):
    write(writer, "acme.orders/event/order.placed", {"a": 1})
    response = api.patch(ENTITY, {"patch": [1]}, format="json")
    assert_problem(response, 422, error_pointers=["/patch"])


@pytest.mark.parametrize(
    ("bad_op", "pointers"),
    [
        (op(colour="red"), ["/ops/0/colour"]),
        (op("delete", content={}), ["/ops/0/content"]),
        (op(namespace="Acme.Orders"), ["/ops/0/namespace"]),
        (op(namespace="acme..orders"), ["/ops/0/namespace"]),
        (op(kind="Event"), ["/ops/0/kind"]),
        (op(kind="1event"), ["/ops/0/kind"]),
        (op(slug="has space"), ["/ops/0/slug"]),
        (op(slug=""), ["/ops/0/slug"]),
        (op(slug="x" * 201), ["/ops/0/slug"]),
        (op(slug=5), ["/ops/0/slug"]),
        (op(content="text"), ["/ops/0/content"]),
        (op("move"), ["/ops/0/op"]),
        (op(if_match="1"), ["/ops/0/if_match"]),
        (op(if_match=0), ["/ops/0/if_match"]),
        (op(if_match=True), ["/ops/0/if_match"]),
        (op(if_none_match="1"), ["/ops/0/if_none_match"]),
        (
            {"op": "put", "namespace": "acme.orders", "kind": "event"},
            ["/ops/0/content", "/ops/0/slug"],
        ),
    ],
    ids=[
        "unknown-field",
        "field-of-another-op",
        "namespace-uppercase",
        "namespace-empty-segment",
        "kind-uppercase",
        "kind-digit-first",
        "slug-space",
        "slug-empty",
        "slug-too-long",
        "slug-not-string",
        "content-not-object",
        "unknown-op",
        "if-match-string",
        "if-match-zero",
        "if-match-bool",
        "if-none-match-not-star",
        "missing-fields",
    ],
)
def test_invalid_batch_op_is_422_pointing_into_the_op(api, bad_op, pointers):
    response = api.post(f"{API}/batch", {"ops": [bad_op]}, format="json")
    assert_problem(response, 422, error_pointers=pointers)


def test_invalid_ops_are_reported_together_with_their_pointers(api):
    body = {"ops": [op(slug="ok"), op(kind="BAD"), op(slug="ok2"), op(content=[])]}
    response = api.post(f"{API}/batch", body, format="json")
    problem = assert_problem(response, 422, error_pointers=["/ops/1/kind", "/ops/3/content"])
    assert problem["pointer"] == "/ops/1/kind"
    assert not Changeset.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"ops": "put"},
        {"ops": [1]},
        {"ops": [], "dry_run": "yes"},
        {"ops": [], "comment": 5},
        {"ops": [], "extra": 1},
        {},
    ],
    ids=["ops-not-list", "op-not-object", "dry-run-not-bool", "comment-not-str", "extra", "empty"],
)
def test_invalid_batch_body_is_422(api, body):
    assert_problem(api.post(f"{API}/batch", body, format="json"), 422)


@pytest.mark.parametrize(
    ("params", "pointers"),
    [
        ({"kind": "BAD"}, ["/kind"]),
        ({"namespace": "Acme"}, ["/namespace"]),
        ({"slug_prefix": "x" * 201}, ["/slug_prefix"]),
        ({"slug_prefix": "a\x00"}, ["/slug_prefix"]),
        ({"page_size": "0"}, ["/page_size"]),
        ({"page_size": "-3"}, ["/page_size"]),
        ({"page_size": "ten"}, ["/page_size"]),
        ({"colour": "red"}, ["/colour"]),
        ({"kind": "BAD", "namespace": "Acme"}, ["/namespace", "/kind"]),
    ],
    ids=[
        "kind",
        "namespace",
        "long-prefix",
        "nul-prefix",
        "page-size-zero",
        "page-size-negative",
        "page-size-text",
        "unknown-parameter",
        "two-errors",
    ],
)
def test_bad_list_filters_are_422(api, params, pointers):
    assert_problem(api.get(f"{API}/entities", params), 422, error_pointers=pointers)


def test_unknown_query_parameter_on_an_entity_or_its_history_is_422(api, write, writer):
    write(writer, "acme.orders/event/order.placed", {"a": 1})
    assert_problem(api.get(ENTITY, {"verbose": "1"}), 422, error_pointers=["/verbose"])
    assert_problem(api.get(f"{ENTITY}/history", {"sort": "asc"}), 422, error_pointers=["/sort"])
    assert_problem(api.get(f"{ENTITY}/history", {"page_size": "0"}), 422)


@pytest.mark.parametrize(
    "content",
    [{"a": "x\u0000y"}, {"a\u0000": 1}, {"a": [{"b": ["\u0000"]}]}],
    ids=["value", "key", "nested"],
)
def test_nul_character_in_content_is_422_not_500(api, content):
    body = assert_problem(api.put(ENTITY, {"content": content}, format="json"), 422)
    assert body["errors"][0]["pointer"].startswith("/content/")
    assert not Changeset.objects.exists()


def test_nul_character_in_patch_batch_op_or_comment_is_422(api, write, writer):
    write(writer, "acme.orders/event/order.placed", {"a": 1})
    assert_problem(api.patch(ENTITY, {"patch": {"a": "\u0000"}}, format="json"), 422)
    response = api.post(f"{API}/batch", {"ops": [op(content={"a": "\u0000"})]}, format="json")
    assert_problem(response, 422, error_pointers=["/ops/0/content/a"])
    response = api.put(ENTITY, {"content": {"a": 2}, "comment": "\u0000"}, format="json")
    assert_problem(response, 422, error_pointers=["/comment"])


def test_nul_slug_prefix_in_delete_by_query_is_422(api):
    body = {"namespace": "acme.orders", "slug_prefix": "\u0000"}
    assert_problem(api.post(f"{API}/delete-by-query", body, format="json"), 422)


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_deeply_nested_content_is_422(api):
    assert_problem(api.put(ENTITY, {"content": nested(100)}, format="json"), 422)
    response = api.post(f"{API}/batch", {"ops": [op(content=nested(100))]}, format="json")
    assert_problem(response, 422)
    assert not Changeset.objects.exists()


def test_content_nested_within_the_limit_is_stored(api):
    response = api.put(ENTITY, {"content": nested(60)}, format="json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    "body",
    [
        '{"content": {"a": 1e400}}',
        '{"content": {"a": -1e400}}',
        '{"content": {"a": "\\ud800"}}',
        '{"content": {"\\udfff": 1}}',
        '{"content": {"a": 1}, "comment": "\\ud800x"}',
    ],
    ids=["overflow", "negative-overflow", "lone-high-surrogate", "lone-low-surrogate", "comment"],
)
def test_unstorable_json_values_are_422_not_500(api, body):
    assert_problem(raw_put(api, body), 422)
    assert not Changeset.objects.exists()


def test_escaped_surrogate_pair_is_a_valid_character(api):
    response = raw_put(api, '{"content": {"emoji": "\\ud83d\\ude00"}}')
    assert response.status_code == 201, response.content
    assert response.json()["entity"]["content"] == {"emoji": "\U0001f600"}


# --- 413 / 415 -------------------------------------------------------------------------


@override_settings(ATLAS_MAX_BODY_BYTES=1000)
def test_body_over_the_body_limit_is_413(api):
    response = api.put(ENTITY, {"content": {"a": "x" * 1000}}, format="json")
    assert_problem(response, 413)
    ops = [op(slug=f"s{i}") for i in range(30)]
    assert_problem(api.post(f"{API}/batch", {"ops": ops}, format="json"), 413)
    assert not Changeset.objects.exists()


@override_settings(ATLAS_MAX_BODY_BYTES=1000)
def test_body_within_the_body_limit_is_accepted(api):
    response = api.put(ENTITY, {"content": {"a": "x" * 900}}, format="json")
    assert response.status_code == 201, response.content


@override_settings(ATLAS_MAX_CONTENT_BYTES=100)
def test_one_content_over_the_content_limit_is_413(api, write, writer):
    assert_problem(api.put(ENTITY, {"content": {"a": "x" * 100}}, format="json"), 413)
    ops = [op(slug="small"), op(slug="big", content={"a": "x" * 100})]
    response = api.post(f"{API}/batch", {"ops": ops}, format="json")
    assert_problem(response, 413, pointer="/ops/1/content")
    assert not Changeset.objects.exists()
    # A patch that grows content past the limit is refused as well.
    write(writer, "acme.orders/event/order.placed", {"a": "x"})
    assert_problem(api.patch(ENTITY, {"patch": {"b": "y" * 100}}, format="json"), 413)
    assert Changeset.objects.count() == 1


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/xml"],
)
def test_unsupported_content_type_is_415(api, content_type):
    response = raw_put(api, '{"content": {}}', content_type=content_type)
    assert_problem(response, 415)
    response = api.post(f"{API}/batch", data='{"ops": []}', content_type=content_type)
    assert_problem(response, 415)


# --- 404 / 405 / 401 ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        f"{API}/entities/Acme.Orders/event/x",
        f"{API}/entities/acme..orders/event/x",
        f"{API}/entities/acme.orders/Event/x",
        f"{API}/entities/acme.orders/event/bad%21slug",
        f"{API}/entities/acme.orders/event/{'x' * 201}",
    ],
    ids=["namespace", "namespace-segment", "kind", "slug-char", "slug-length"],
)
@pytest.mark.parametrize("method", ["get", "put", "patch", "delete", "history"])
def test_invalid_name_in_url_path_is_404(api, path, method):
    if method == "history":
        response = api.get(path + "/history")
    elif method == "put":
        response = api.put(path, {"content": {}}, format="json")
    elif method == "patch":
        response = api.patch(path, {"patch": {}}, format="json")
    else:
        response = getattr(api, method)(path)
    assert_problem(response, 404)


@pytest.mark.parametrize(
    "path",
    [
        f"{API}/nope",
        f"{API}/entities/acme.orders/event",
        f"{API}/entities/acme.orders/event/x/history/more",
        f"{API}/",
    ],
)
def test_unknown_url_under_api_is_404_problem_json(api, path):
    assert_problem(api.get(path), 404)


@override_settings(DEBUG=True)
@pytest.mark.parametrize("method", ["get", "post", "put", "delete"])
@pytest.mark.parametrize(
    "path", [f"{API}/entities/acme.orders/event/x/nope", "/api/nope", "/api/v2/entities"]
)
def test_unknown_url_under_api_is_problem_json_with_debug_on(api, method, path):
    """``make run`` serves with DEBUG on, where Django answers an unresolved URL with its
    HTML debug page and never calls ``handler404``; a typo in an API path must still get
    problem+json (and so must a host project, whose own ``handler404`` is not Atlas's),
    under ``/api/v1/`` and beside it (a wrong version, a missing one)."""
    body = assert_problem(getattr(api, method)(path), 404)
    assert body["instance"] == path


@pytest.mark.parametrize("path", ["/api/schema", "/api/docs"])
def test_the_schema_and_docs_without_their_slash_still_redirect(client, path):
    response = client.get(path)
    assert response.status_code == 301
    assert response["Location"] == f"{path}/"


@override_settings(DEBUG=True)
def test_unknown_url_outside_the_api_keeps_djangos_page(client):
    response = client.get("/no-such-page")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_unsupported_method_is_405_problem_json(api):
    body = assert_problem(api.post(ENTITY, {"content": {}}, format="json"), 405)
    assert body["title"] == "Method not allowed"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", f"{API}/entities", None),
        ("get", ENTITY, None),
        ("get", f"{ENTITY}/history", None),
        ("put", ENTITY, {"content": {}}),
        ("patch", ENTITY, {"patch": {}}),
        ("delete", ENTITY, None),
        ("post", f"{API}/batch", {"ops": []}),
        ("post", f"{API}/delete-by-query", {"namespace": "acme.orders"}),
    ],
)
def test_anonymous_request_is_401_with_www_authenticate(client_for, namespace, method, path, body):
    response = getattr(client_for(None), method)(path, body, format="json")
    assert_problem(response, 401)
    assert response["WWW-Authenticate"] == "Token"


def test_unknown_token_is_401(client, namespace):
    response = client.get(f"{API}/entities", headers={"Authorization": "Token not-a-token"})
    assert_problem(response, 401)
    assert response["WWW-Authenticate"] == "Token"


# --- page tokens ---------------------------------------------------------------------------


@pytest.fixture
def three_entities(write, writer):
    for slug in ("a", "b", "c"):
        write(writer, f"acme.orders/event/{slug}", {"slug": slug})


def first_token(client, path: str = f"{API}/entities", **params: Any) -> str:
    response = client.get(path, {"page_size": 1, **params})
    assert response.status_code == 200, response.content
    token = response.json()["next_page_token"]
    assert token
    return token


def test_tampered_page_token_is_400(api, three_entities):
    token = first_token(api)
    flipped = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    for bad in (flipped, token + "x", token[5:], "garbage", "Zm9v:bar:baz"):
        response = api.get(f"{API}/entities", {"page_size": 1, "page_token": bad})
        assert_problem(response, 400, pointer="/page_token")


def test_page_token_of_another_user_is_400(api, client_for, make_user, three_entities):
    token = first_token(api)
    other = client_for(make_user("olga", reader=["acme.orders"]))
    response = other.get(f"{API}/entities", {"page_size": 1, "page_token": token})
    assert_problem(response, 400)


def test_page_token_of_another_listing_is_400(api, three_entities, write, writer):
    token = first_token(api)
    response = api.get(f"{API}/entities", {"page_size": 1, "page_token": token, "kind": "event"})
    assert_problem(response, 400)
    response = api.get(f"{API}/entities/acme.orders/event/a/history", {"page_token": token})
    assert_problem(response, 400)
    write(writer, "acme.orders/event/a", {"v": 2})
    history_token = first_token(api, f"{API}/entities/acme.orders/event/a/history")
    response = api.get(f"{API}/entities/acme.orders/event/b/history", {"page_token": history_token})
    assert_problem(response, 400)
    response = api.get(f"{API}/entities", {"page_token": history_token})
    assert_problem(response, 400)


# --- mapping of unexpected failures -------------------------------------------------------


def test_unexpected_error_is_500_problem_json_without_details(api, monkeypatch):
    def explode(**kwargs: Any) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(views, "changeset_apply", explode)
    body = assert_problem(api.put(ENTITY, {"content": {}}, format="json"), 500)
    assert "secret internals" not in json.dumps(body)


def test_database_unavailable_is_503_with_retry_after(api, monkeypatch):
    def unavailable(**kwargs: Any) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr(views, "changeset_apply", unavailable)
    response = api.put(ENTITY, {"content": {}}, format="json")
    assert_problem(response, 503)
    assert response["Retry-After"] == "5"


def test_drf_validation_errors_flatten_to_json_pointers():
    errors = {
        "ops": [{}, {"slug": ["Bad slug."]}],
        "a/b~c": ["Escaped."],
        "non_field_errors": ["Whole body."],
    }
    assert flatten_errors(errors) == [
        {"pointer": "/ops/1/slug", "detail": "Bad slug."},
        {"pointer": "/a~1b~0c", "detail": "Escaped."},
        {"pointer": "/", "detail": "Whole body."},
    ]
    error = problem_for(ValidationError({"slug": ["Bad slug."]}))
    assert error is not None
    assert (error.status, error.pointer, error.detail) == (422, "/slug", "Bad slug.")


@pytest.mark.parametrize("path", ["acme.orders/order/a%0A", "acme.orders/order%0A/a"])
def test_a_trailing_newline_in_a_path_name_is_404_not_500(staff, namespace, client_for, path):
    response = client_for(staff).put(f"/api/v1/entities/{path}", {"content": {}}, format="json")
    assert response.status_code == 404


def test_a_trailing_newline_in_a_batch_slug_is_422(staff, namespace, client_for):
    response = client_for(staff).post(
        "/api/v1/batch",
        {
            "ops": [
                {
                    "op": "put",
                    "namespace": "acme.orders",
                    "kind": "order",
                    "slug": "b\n",
                    "content": {},
                }
            ]
        },
        format="json",
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/ops/0/slug"


@pytest.mark.parametrize(
    "value", ["0409-02-16T04:14:34+20:03", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"]
)
def test_timestamps_with_extreme_offsets_are_422_or_read_never_500(staff, client_for, value):
    response = client_for(staff).get("/api/v1/changesets", {"since": value})
    assert response.status_code in (200, 422), response.content
