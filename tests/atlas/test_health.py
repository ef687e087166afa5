"""Who may read /metrics and /api/v1/log/head (API.md, "Limits and visibility")."""

from __future__ import annotations

import pytest

from tests.atlas.test_errors import assert_problem
from tests.entities.factories import StaffFactory, UserFactory

pytestmark = pytest.mark.django_db

SCRAPE_SECRET = "a-long-random-scrape-secret"


@pytest.fixture
def metrics_token(settings):
    settings.ATLAS_METRICS_TOKEN = SCRAPE_SECRET
    return SCRAPE_SECRET


def assert_metrics(response):
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    assert b"atlas_metrics_database_up" in response.content


def test_metrics_refuse_anonymous_callers_with_401_naming_the_bearer_scheme(client):
    response = client.get("/metrics")
    assert_problem(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_metrics_answer_a_scraper_with_the_metrics_token(client, metrics_token):
    # Prometheus's own Accept header must not make it a 406.
    accept = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3"
    assert_metrics(
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {metrics_token}", HTTP_ACCEPT=accept)
    )


@pytest.mark.parametrize("header", ["Bearer wrong-secret", "Bearer", f"Bearer {SCRAPE_SECRET} x"])
def test_metrics_refuse_a_wrong_bearer_token_with_401(client, metrics_token, header):
    assert_problem(client.get("/metrics", HTTP_AUTHORIZATION=header), 401)


def test_with_no_metrics_token_configured_no_bearer_token_is_accepted(client, settings):
    settings.ATLAS_METRICS_TOKEN = ""
    assert_problem(client.get("/metrics", HTTP_AUTHORIZATION="Bearer "), 401)
    assert_problem(client.get("/metrics", HTTP_AUTHORIZATION="Bearer x"), 401)


def test_metrics_answer_a_superuser_by_token_and_by_session(client, client_for):
    root = UserFactory(username="root", is_superuser=True, is_staff=True)
    assert_metrics(client_for(root).get("/metrics"))
    client.force_login(root)
    assert_metrics(client.get("/metrics"))


@pytest.mark.parametrize("factory", [UserFactory, StaffFactory])
def test_metrics_refuse_other_users_with_403(client, client_for, factory):
    user = factory(username="someone")
    assert_problem(client_for(user).get("/metrics"), 403)
    client.force_login(user)
    assert_problem(client.get("/metrics"), 403)


def test_metrics_are_not_in_the_api_schema(client):
    assert b"/metrics" not in client.get("/api/schema/").content


def test_log_head_needs_an_authenticated_user(client, client_for):
    assert_problem(client.get("/api/v1/log/head"), 401)
    body = client_for(UserFactory(username="reader")).get("/api/v1/log/head").json()
    assert set(body) == {"seq", "hash", "at"}


def test_health_probes_still_answer_anyone(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
