"""ATLAS_HTTPS: the settings `manage.py check --deploy` asks for, and probes that stay on HTTP."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.core.exceptions import ImproperlyConfigured

from atlas.settings import ATLAS_HTTPS_EXEMPT_PATHS, proxy_ssl_header

BASE_DIR = Path(__file__).resolve().parents[2]


def check_deploy(**env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py check --deploy --fail-level WARNING`` with production-like settings."""
    child = {
        **os.environ,
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "atlas.example.com",
        "DATABASE_URL": os.environ.get("DATABASE_URL") or "postgres://unused@127.0.0.1/unused",
        **env,
    }
    # Not from this process: the e2e fixtures set DJANGO_ALLOW_ASYNC_UNSAFE while they run.
    for name in ("ATLAS_HTTPS", "ATLAS_PROXY_SSL_HEADER", "DJANGO_ALLOW_ASYNC_UNSAFE"):
        if name not in env:
            child.pop(name, None)
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR,
        env=child,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_deploy_passes_with_atlas_https_on():
    result = check_deploy(ATLAS_HTTPS="1", ATLAS_PROXY_SSL_HEADER="X-Forwarded-Proto: https")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_warns_about_https_without_it():
    result = check_deploy()
    assert result.returncode != 0
    found = set(re.findall(r"security\.W\d+", result.stdout + result.stderr))
    assert {"security.W004", "security.W008", "security.W012", "security.W016"} <= found


@pytest.fixture
def https_on(settings):
    """What ATLAS_HTTPS=1 sets (settings are read once, at import)."""
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_REDIRECT_EXEMPT = ATLAS_HTTPS_EXEMPT_PATHS
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SECURE_PROXY_SSL_HEADER = proxy_ssl_header("X-Forwarded-Proto: https")
    settings.ALLOWED_HOSTS = ["atlas.example.com"]


@pytest.mark.django_db
def test_with_https_on_plain_http_is_redirected_but_probes_and_scrapes_are_not(client, https_on):
    host = {"HTTP_HOST": "atlas.example.com"}
    api = client.get("/api/v1/namespaces", **host)
    assert api.status_code == 301
    assert api["Location"] == "https://atlas.example.com/api/v1/namespaces"
    assert client.get("/healthz", **host).status_code == 200
    assert client.get("/readyz", **host).status_code == 200
    assert client.get("/metrics", **host).status_code == 401  # not redirected; still guarded


@pytest.mark.django_db
def test_with_https_on_a_request_the_proxy_marks_https_is_served_with_hsts(client, https_on):
    response = client.get("/healthz", HTTP_HOST="atlas.example.com", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 200
    assert response["Strict-Transport-Security"].startswith("max-age=31536000")
    anonymous = client.get(
        "/api/v1/namespaces", HTTP_HOST="atlas.example.com", HTTP_X_FORWARDED_PROTO="https"
    )
    assert anonymous.status_code == 401  # served, not redirected


def test_the_proxy_ssl_header_setting_is_parsed_or_refused():
    assert proxy_ssl_header("X-Forwarded-Proto: https") == ("HTTP_X_FORWARDED_PROTO", "https")
    assert proxy_ssl_header("") is None
    for bad in ("X-Forwarded-Proto", "X-Forwarded-Proto:", ": https", "X Forwarded: https"):
        with pytest.raises(ImproperlyConfigured):
            proxy_ssl_header(bad)


def test_compose_turns_https_on():
    env = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())["x-atlas-env"]
    assert env["ATLAS_HTTPS"] == "${ATLAS_HTTPS:-1}"
    assert "X-Forwarded-Proto: https" in env["ATLAS_PROXY_SSL_HEADER"]


def test_compose_offers_a_pooler_and_a_replica_as_profiles():
    """docs/deploy.md "docker-compose: a pooler and a replica": off by default, and the
    settings Atlas needs behind them come from .env."""
    compose = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())
    services = compose["services"]
    assert services["pgbouncer"]["profiles"] == ["pooled"]
    assert services["pgbouncer"]["environment"]["POOL_MODE"] == "transaction"
    assert services["replica"]["profiles"] == ["replicas"]
    assert "pg_basebackup" in " ".join(services["replica"]["command"])
    assert "replicadata" in compose["volumes"]
    for name in ("postgres", "redis", "web", "worker", "beat"):
        assert "profiles" not in services[name], name  # the default shape is unchanged
    env = compose["x-atlas-env"]
    for name in ("ATLAS_DB_POOLING", "ATLAS_DIRECT_DATABASE_URL", "ATLAS_READ_DATABASE_URLS"):
        assert env[name] == f"${{{name}:-}}", name
    mount = "./atlas/deploy/postgres/replication.sh"
    assert any(v.startswith(mount) for v in services["postgres"]["volumes"])
    assert (BASE_DIR / mount).is_file()
