"""API tokens: hashed at rest, one query per request, minted by command or admin."""

from __future__ import annotations

import importlib
import io
import re
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from rest_framework.test import APIClient

from atlas.api.auth import TokenAuthentication
from atlas.models import ApiToken
from atlas.services import api_token_create, api_token_revoke
from atlas.tokens import key_digest
from tests.atlas.test_errors import assert_problem
from tests.entities.factories import StaffFactory, UserFactory

pytestmark = pytest.mark.django_db

NAMESPACES = "/api/v1/namespaces"


def token_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_a_new_key_authenticates_and_only_its_digest_is_stored():
    user = UserFactory(username="alice")
    token, key = api_token_create(user=user, name="laptop")

    assert re.fullmatch(r"atlas_[0-9a-f]{40}", key)
    assert token_client(key).get(NAMESPACES).status_code == 200
    row = ApiToken.objects.values().get(pk=token.pk)
    assert row["digest"] == key_digest(key)
    assert row["prefix"] == key[:14]
    assert key not in {str(value) for value in row.values()}


def test_authenticating_a_token_is_one_query(django_assert_num_queries):
    _, key = api_token_create(user=UserFactory(username="alice"))
    with django_assert_num_queries(1):
        user, token = TokenAuthentication().authenticate_credentials(key)
        assert user.username == "alice"  # the user came with the token
    assert token.user_id == user.pk


@pytest.mark.parametrize(
    "header",
    ["Token atlas_0000000000000000000000000000000000000000", "Token", "Token a b"],
)
def test_an_unknown_key_or_a_malformed_header_is_refused_with_401(header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get(NAMESPACES)
    assert_problem(response, 401)
    assert response["WWW-Authenticate"] == "Token"


def test_a_revoked_token_is_refused_with_401():
    token, key = api_token_create(user=UserFactory(username="alice"))
    api_token_revoke(token=token)
    assert_problem(token_client(key).get(NAMESPACES), 401)


def test_a_token_of_an_inactive_user_is_refused_with_401():
    user = UserFactory(username="alice", is_active=False)
    _, key = api_token_create(user=user)
    assert_problem(token_client(key).get(NAMESPACES), 401)


def test_a_user_may_hold_several_tokens_and_each_works():
    user = UserFactory(username="alice")
    keys = [api_token_create(user=user, name=name)[1] for name in ("ci", "laptop")]
    assert len(set(keys)) == 2
    assert all(token_client(key).get(NAMESPACES).status_code == 200 for key in keys)


def test_create_token_prints_only_the_key_and_the_key_works():
    UserFactory(username="alice")
    out, err = io.StringIO(), io.StringIO()
    call_command("create_token", "alice", "--name", "ci", stdout=out, stderr=err)

    key = out.getvalue().strip()
    assert re.fullmatch(r"atlas_[0-9a-f]{40}", key)
    assert key[:14] in err.getvalue()
    assert ApiToken.objects.get(digest=key_digest(key)).name == "ci"
    assert token_client(key).get(NAMESPACES).status_code == 200


def test_create_token_for_an_unknown_user_fails():
    with pytest.raises(CommandError, match="no user"):
        call_command("create_token", "nobody", stdout=io.StringIO(), stderr=io.StringIO())
    assert not ApiToken.objects.exists()


def test_the_demo_prints_a_working_token_that_stays_the_same_across_runs(monkeypatch):
    monkeypatch.setenv("ATLAS_DEMO_PASSWORD", "demo-password-for-tests")
    first, second = io.StringIO(), io.StringIO()
    call_command("atlas_demo", stdout=first)
    call_command("atlas_demo", stdout=second)

    keys = [re.search(r"token\s+(\S+)", out.getvalue()).group(1) for out in (first, second)]
    assert keys[0] == keys[1]
    assert ApiToken.objects.filter(user__username="demo").count() == 1
    assert token_client(keys[0]).get(NAMESPACES).status_code == 200


def test_stock_drf_tokens_are_converted_so_their_keys_keep_working():
    """Migration 0004 on a database that still has DRF's ``authtoken_token`` table."""
    user = UserFactory(username="old-client")
    old_key = "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
            "created timestamptz NOT NULL, user_id integer NOT NULL UNIQUE)"
        )
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, now(), %s)", [old_key, user.pk])
        cursor.execute(
            "INSERT INTO django_migrations (app, name, applied) "
            "VALUES ('authtoken', '0001_initial', now())"
        )
    migration = importlib.import_module("atlas.migrations.0004_convert_drf_tokens")

    migration.convert_drf_tokens(None, SimpleNamespace(connection=connection))

    token = ApiToken.objects.get(user=user)
    assert (token.prefix, token.digest) == (old_key[:8], key_digest(old_key))
    assert token_client(old_key).get(NAMESPACES).status_code == 200
    assert "authtoken_token" not in connection.introspection.table_names()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_migrations WHERE app = 'authtoken'")
        assert cursor.fetchone()[0] == 0
    # A second run (a fresh install has no such table) does nothing.
    migration.convert_drf_tokens(None, SimpleNamespace(connection=connection))
    assert ApiToken.objects.count() == 1


# --- the admin -------------------------------------------------------------------------

CHANGELIST = "/admin/atlas/apitoken/"


@pytest.fixture
def superuser():
    return UserFactory(username="root", is_superuser=True, is_staff=True)


def test_the_admin_lists_tokens_by_prefix_and_never_shows_a_key_or_digest(client, superuser):
    token, key = api_token_create(user=UserFactory(username="alice"), name="laptop")
    client.force_login(superuser)

    for url in (CHANGELIST, f"{CHANGELIST}{token.pk}/change/"):
        page = client.get(url)
        assert page.status_code == 200
        text = page.content.decode()
        assert f"{token.prefix}…" in text
        assert key not in text
        assert token.digest not in text


def test_only_superusers_may_create_or_revoke_tokens_in_the_admin(client):
    from django.contrib.auth.models import Permission

    auditor = StaffFactory(username="auditor")
    auditor.user_permissions.set(
        Permission.objects.filter(codename__in=["view_apitoken", "add_apitoken", "delete_apitoken"])
    )
    token, key = api_token_create(user=UserFactory(username="alice"))
    client.force_login(auditor)

    assert client.get(CHANGELIST).status_code == 200  # viewing prefixes is allowed
    assert client.get(f"{CHANGELIST}add/").status_code == 403
    assert client.post(f"{CHANGELIST}{token.pk}/delete/", {"post": "yes"}).status_code == 403
    assert ApiToken.objects.filter(pk=token.pk).exists()
    changelist = client.get(CHANGELIST).content.decode()
    assert "delete_selected" not in changelist


def test_a_superuser_creates_a_token_in_the_admin_and_sees_its_key_once(client, superuser):
    alice = UserFactory(username="alice")
    client.force_login(superuser)

    page = client.post(f"{CHANGELIST}add/", {"user": alice.pk, "name": "ci"})

    assert page.status_code == 200
    assert "no-store" in page["Cache-Control"]
    key = re.search(r'id="api-token-key">([^<]+)<', page.content.decode()).group(1)
    token = ApiToken.objects.get(user=alice)
    assert (token.name, token.digest) == ("ci", key_digest(key))
    assert token_client(key).get(NAMESPACES).status_code == 200
    assert key not in client.get(f"{CHANGELIST}{token.pk}/change/").content.decode()


def test_a_superuser_revokes_a_token_in_the_admin(client, superuser):
    token, key = api_token_create(user=UserFactory(username="alice"))
    client.force_login(superuser)

    response = client.post(f"{CHANGELIST}{token.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert_problem(token_client(key).get(NAMESPACES), 401)
