"""API responses are encoded by orjson with DRF's rules (``atlas.api.renderers``).

The bytes are what DRF's own renderer writes for every page a client reads;
what orjson cannot or would write differently goes through DRF.
"""

from __future__ import annotations

import datetime
import json
import uuid

import pytest
from rest_framework import renderers

from atlas.api.renderers import JSONRenderer

pytestmark = pytest.mark.django_db

DRF = renderers.JSONRenderer()
OURS = JSONRenderer()


def test_every_page_a_client_reads_is_drfs_bytes(client_for, staff, write, writer, namespace):
    ns = namespace.name
    for n in range(3):
        write(
            writer, f"{ns}/item/a", {"n": n, "text": 'é \u2028 "quoted"', "list": [1, None, True]}
        )
        write(writer, f"{ns}/item/b{n}", {"nested": {"deep": [{"x": 1.25}]}, "big": 2**62})
    api = client_for(staff)
    changeset = api.get("/api/v1/changesets").json()["results"][0]["id"]
    pages = [
        f"/api/v1/entities?namespace={ns}",
        f"/api/v1/entities/{ns}/item/a",
        f"/api/v1/entities/{ns}/item/a/history",
        "/api/v1/changesets",
        f"/api/v1/changesets/{changeset}",
        f"/api/v1/changes?namespace={ns}&capture=old_and_new_values",
        "/api/v1/entities/no.such/item/x",  # a problem+json body
    ]
    for url in pages:
        response = api.get(url)
        assert isinstance(response.accepted_renderer, JSONRenderer), url
        assert response.content == DRF.render(response.data), url
    assert b"\\u2028" in api.get(f"/api/v1/entities/{ns}/item/a").content


def test_what_orjson_would_write_differently_goes_through_drf():
    cases = [
        {"big": 2**70, "small": -(2**64)},  # beyond 64 bits: orjson refuses
        {1: "an integer key"},  # keys that are not strings: orjson refuses
        {"at": datetime.datetime(2026, 12, 7, 12, 0, 0, 123456, tzinfo=datetime.UTC)},
        {"naive": datetime.datetime(2026, 12, 7, 12, 0), "day": datetime.date(2026, 12, 7)},
        {"id": uuid.UUID("01a250b9-4fc8-7bb6-aa60-8e628b8b5737"), "tuple": (1, 2)},
        {"separators": "\u2028\u2029", "unicode": "日本語"},
    ]
    for data in cases:
        assert OURS.render(data) == DRF.render(data), data
    assert OURS.render(None) == DRF.render(None) == b""


def test_an_indent_the_client_asks_for_is_drfs():
    data = {"a": [1, {"b": 2}]}
    accepted = "application/json; indent=2"
    assert OURS.render(data, accepted) == DRF.render(data, accepted)
    assert b"\n" in OURS.render(data, accepted)


def test_small_floats_are_the_same_numbers_spelled_without_padding():
    data = {"tiny": 1.5e-07, "tinier": 1e-05, "plain": 0.1, "huge": 1e22, "zero": -0.0}
    ours = OURS.render(data)
    assert json.loads(ours) == json.loads(DRF.render(data)) == data
    assert b'"tiny":1.5e-7' in ours


def test_a_big_integer_in_content_comes_back_exactly(client_for, writer, namespace):
    api = client_for(writer)
    url = f"/api/v1/entities/{namespace.name}/item/big"
    content = {"n": 2**70, "m": -(2**80)}
    assert api.put(url, {"content": content}, format="json").status_code in (200, 201)
    assert json.loads(api.get(url).content)["content"] == content
