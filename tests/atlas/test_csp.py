"""The Content-Security-Policy on HTML pages, and Swagger UI served from our own origin."""

from __future__ import annotations

import re

import pytest

from tests.entities.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def root_client(client):
    client.force_login(UserFactory(username="root", is_superuser=True, is_staff=True))
    return client


@pytest.mark.parametrize("url", ["/admin/", "/admin/atlas/apitoken/", "/admin/atlas/apitoken/add/"])
def test_admin_pages_carry_the_content_security_policy(root_client, settings, url):
    response = root_client.get(url)
    assert response.status_code == 200
    assert response["Content-Security-Policy"] == settings.ATLAS_CONTENT_SECURITY_POLICY
    assert "script-src 'self';" in response["Content-Security-Policy"]


def test_the_docs_page_loads_swagger_ui_from_our_static_files_with_no_inline_script(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    assert "Content-Security-Policy" in response
    html = response.content.decode()
    sources = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', html)
    assert any(s.endswith("swagger-ui-bundle.js") for s in sources)
    assert all(s.startswith("/") and not s.startswith("//") for s in sources), sources
    assert "cdn" not in html and "@latest" not in html
    assert not re.search(r"<script>", html)  # every script has a src: CSP lets it run
    start_up = client.get("/api/docs/?script=")
    assert start_up.status_code == 200
    assert "SwaggerUIBundle" in start_up.content.decode()


def test_the_login_page_carries_the_policy(client, settings):
    response = client.get("/admin/login/")
    assert response["Content-Security-Policy"] == settings.ATLAS_CONTENT_SECURITY_POLICY


def test_json_responses_go_without_the_policy(client):
    assert "Content-Security-Policy" not in client.get("/healthz")


def test_an_empty_policy_setting_sends_no_header(client, settings):
    settings.ATLAS_CONTENT_SECURITY_POLICY = ""
    assert "Content-Security-Policy" not in client.get("/admin/login/")
