"""Strong ETags survive compression; stale tags are 412 (issue 7, item 9; docs/reliability.md).

Django's stock ``GZipMiddleware`` weakens every strong ETag it compresses
(``"3"`` → ``W/"3"``). Atlas compresses with ``atlas.middleware.GZipMiddleware``,
which keeps the entity's version tag strong. Checked in process (Django's test
client, ``Accept-Encoding: gzip``) and over HTTP against gunicorn.
"""

from __future__ import annotations

import gzip
import json

import pytest
from django.conf import settings as django_settings

from tests.reliability.harness import (
    Api,
    database_url_of_tests,
    gunicorn,
    principal,
    publishing,
    record,
)

NS = "rel.etag"
BIG = {"text": "compressible " * 200, "n": 0}  # well over the 200-byte gzip threshold
GZ = {"HTTP_ACCEPT_ENCODING": "gzip, deflate"}


def decoded(response) -> dict:
    body = response.content
    if response.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return json.loads(body)


@pytest.fixture
def api(db, client_for):
    user, _ = principal("etagger", writer_of=(NS,))
    return client_for(user)


def test_the_project_compresses_with_the_strong_etag_middleware():
    assert "atlas.middleware.GZipMiddleware" in django_settings.MIDDLEWARE
    assert "django.middleware.gzip.GZipMiddleware" not in django_settings.MIDDLEWARE


def test_stock_django_gzip_would_weaken_the_etag(api, settings):
    """Why Atlas ships its own: with Django's GZipMiddleware the tag turns weak."""
    settings.MIDDLEWARE = [
        "django.middleware.gzip.GZipMiddleware" if m == "atlas.middleware.GZipMiddleware" else m
        for m in settings.MIDDLEWARE
    ]
    path = f"/api/v1/entities/{NS}/doc/d"
    assert api.put(path, {"content": BIG}, format="json").status_code == 201
    response = api.get(path, **GZ)
    assert response["Content-Encoding"] == "gzip"
    assert response["ETag"] == 'W/"1"'


def test_compressed_responses_keep_strong_etags_and_stale_tags_fail(api):
    path = f"/api/v1/entities/{NS}/doc/d"
    created = api.put(path, {"content": BIG}, format="json", **GZ)
    assert created.status_code == 201
    assert created["Content-Encoding"] == "gzip"
    assert created["ETag"] == '"1"', "a compressed write response keeps its strong tag"

    got = api.get(path, **GZ)
    assert got["Content-Encoding"] == "gzip" and "Accept-Encoding" in got["Vary"]
    assert got["ETag"] == '"1"'
    assert decoded(got)["version"] == 1
    plain = api.get(path)
    assert "Content-Encoding" not in plain and plain["ETag"] == '"1"'  # same tag either way

    # The tag read from a compressed response makes a conditional write.
    updated = api.put(
        path, {"content": {**BIG, "n": 1}}, format="json", HTTP_IF_MATCH=got["ETag"], **GZ
    )
    assert updated.status_code == 200 and updated["ETag"] == '"2"'
    assert decoded(updated)["entity"]["version"] == 2

    patched = api.patch(path, {"patch": {"n": 2}}, format="json", HTTP_IF_MATCH='"2"', **GZ)
    assert patched.status_code == 200 and patched["Content-Encoding"] == "gzip"
    assert patched["ETag"] == '"3"', "a compressed PATCH response keeps its strong tag"
    # Stale tags, strong or weak, on every conditional write: 412 problem+json.
    stale = [
        ("put", {"content": {**BIG, "n": 9}}),
        ("patch", {"patch": {"n": 9}}),
        ("delete", None),
    ]
    for method, body in stale:
        for tag in ('"1"', 'W/"1"'):
            response = getattr(api, method)(path, body, format="json", HTTP_IF_MATCH=tag, **GZ)
            assert response.status_code == 412, (method, tag, response.content)
            assert response["Content-Type"].startswith("application/problem+json")
            assert decoded(response)["status"] == 412
    # If-None-Match with the current strong tag: 304, tag still strong.
    not_modified = api.get(path, HTTP_IF_NONE_MATCH='"3"', **GZ)
    assert not_modified.status_code == 304 and not_modified["ETag"] == '"3"'
    # An idempotent replay of a compressed write keeps the strong tag too.
    key = {"HTTP_IDEMPOTENCY_KEY": "etag-replay"}
    body = {"content": {**BIG, "n": 4}}
    first = api.put(path, body, format="json", HTTP_IF_MATCH='"3"', **key, **GZ)
    again = api.put(path, body, format="json", HTTP_IF_MATCH='"3"', **key, **GZ)
    assert first.status_code == again.status_code == 200
    assert first["ETag"] == again["ETag"] == '"4"'
    assert again["Idempotent-Replayed"] == "true"
    assert decoded(first) == decoded(again)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_strong_etags_over_http_through_gunicorn():
    _, token = principal("etagger", writer_of=(NS,))
    with publishing() as pub, gunicorn(database_url_of_tests(), env=pub) as server:
        api = Api(server.url, token)  # requests asks for gzip and decodes it
        path = f"/api/v1/entities/{NS}/doc/h"
        created = api.put(path, json={"content": BIG})
        assert created.status_code == 201
        assert created.headers["Content-Encoding"] == "gzip" and created.headers["ETag"] == '"1"'
        got = api.get(path)
        assert got.headers["Content-Encoding"] == "gzip" and got.headers["ETag"] == '"1"'
        ok = api.put(
            path, json={"content": {**BIG, "n": 1}}, headers={"If-Match": got.headers["ETag"]}
        )
        assert ok.status_code == 200 and ok.headers["ETag"] == '"2"'
        stale = api.put(path, json={"content": {**BIG, "n": 2}}, headers={"If-Match": '"1"'})
        assert stale.status_code == 412 and stale.json()["status"] == 412
        feed = api.get("/api/v1/changes")
        assert feed.headers["Content-Encoding"] == "gzip"
        api.close()
    record(
        "strong_etags_under_gzip",
        middleware="atlas.middleware.GZipMiddleware",
        compressed_get_etag=got.headers["ETag"],
        compressed_write_etag=ok.headers["ETag"],
        stale_if_match="412",
        stock_django_gzip='weakens to W/"<v>" (why Atlas ships its own)',
    )
