"""Subscriptions API (superusers): create with a secret shown once, read, change, delete,
rotate the secret, retry or skip a parked delivery; the SSRF address rule."""

from __future__ import annotations

import pytest
import yaml

from atlas.exceptions import ValidationFailed
from changesets.models import Subscription
from changesets.outbox.subscriptions import check_webhook_url
from changesets.selectors import feed
from tests.entities.factories import NamespaceFactory, UserFactory

pytestmark = pytest.mark.django_db

API = "/api/v1/subscriptions"
NS = "acme.orders"
URL = "https://hooks.example.com/atlas"
FIELDS = {
    "id",
    "name",
    "url",
    "namespaces",
    "capture",
    "active",
    "cursor",
    "lag",
    "last_delivery_at",
    "last_error",
    "consecutive_failures",
    "next_attempt_at",
    "deliveries",
    "parked",
    "previous_secret_expires_at",
    "created_at",
    "updated_at",
}


@pytest.fixture(autouse=True)
def public_dns(monkeypatch, settings):
    """hooks.example.com resolves to a public address without a network."""
    import socket

    real = socket.getaddrinfo

    def fake(host, port, *args, **kwargs):
        if host == "hooks.example.com":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port))]
        if host == "intranet.example.com":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = False


@pytest.fixture
def root(db):
    return UserFactory(username="root", is_superuser=True, is_staff=True)


@pytest.fixture
def api(root, client_for):
    return client_for(root)


@pytest.fixture
def woken(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(
        "changesets.outbox.pumps.enqueue_pump", lambda sid, countdown=None: calls.append(sid)
    )
    return calls


def create(api, **body):
    body = {"name": "search index", "url": URL, **body}
    return api.post(API, body, format="json")


def test_a_superuser_creates_a_subscription_and_sees_the_secret_once(api, namespace, woken):
    response = create(api, namespaces=[NS], capture="new_row")

    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == FIELDS | {"secret"}
    assert len(body["secret"]) >= 32
    assert body["namespaces"] == [NS]
    assert body["capture"] == "new_row"
    assert body["active"] is True
    assert body["lag"] == 0
    assert body["last_delivery_at"] is None and body["last_error"] == ""
    assert body["deliveries"] == {"ok": 0, "failed": 0}
    assert feed.cursor_decode(body["cursor"]) == 0
    # Stored as issued (it is the HMAC key).
    assert Subscription.objects.get(pk=body["id"]).secret == body["secret"]

    again = api.get(f"{API}/{body['id']}")
    assert again.status_code == 200
    assert "secret" not in again.json()
    listed = api.get(API).json()
    assert [s["id"] for s in listed["results"]] == [body["id"]]
    assert "secret" not in listed["results"][0]
    assert listed["next_page_token"] is None


def test_defaults(api, db, woken):
    body = create(api).json()
    assert body["namespaces"] == [] and body["capture"] == "new_values" and body["active"]


def test_creating_wakes_the_pump_after_commit(api, db, woken, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        body = create(api).json()
    assert woken == [body["id"]]


def test_lag_counts_baseline_changesets_in_its_namespaces_after_the_cursor(
    api, staff, namespace, write, woken
):
    NamespaceFactory(name="acme.billing")
    write(staff, f"{NS}/order/a", {"n": 1})
    write(staff, f"{NS}/order/a", {"n": 2})
    write(staff, "acme.billing/invoice/i", {"n": 1})

    every = create(api).json()
    orders = create(api, namespaces=[NS]).json()
    now = create(api, namespaces=[NS], start="now").json()

    assert (every["lag"], orders["lag"], now["lag"]) == (3, 2, 0)
    assert feed.cursor_decode(now["cursor"]) == feed.watermark()["seq"]


def test_patch_changes_fields_and_clears_the_backoff(api, namespace, woken):
    body = create(api).json()
    from django.utils import timezone

    Subscription.objects.filter(pk=body["id"]).update(
        consecutive_failures=4, next_attempt_at=timezone.now(), last_error="HTTP 500"
    )

    response = api.patch(
        f"{API}/{body['id']}",
        {"name": "renamed", "namespaces": [NS], "capture": "old_and_new_values", "active": False},
        format="json",
    )

    assert response.status_code == 200, response.content
    patched = response.json()
    assert patched["name"] == "renamed"
    assert patched["namespaces"] == [NS]
    assert patched["capture"] == "old_and_new_values"
    assert patched["active"] is False
    assert patched["consecutive_failures"] == 0 and patched["next_attempt_at"] is None
    assert "secret" not in patched


def test_patch_cursor_replays_or_skips(api, staff, namespace, write, woken):
    write(staff, f"{NS}/order/a", {"n": 1})
    page = api.get("/api/v1/changes").json()
    body = create(api, start="now").json()
    assert body["lag"] == 0

    rewound = api.patch(
        f"{API}/{body['id']}", {"cursor": feed.cursor_encode(0)}, format="json"
    ).json()
    assert rewound["lag"] == 1
    forward = api.patch(f"{API}/{body['id']}", {"cursor": page["next_cursor"]}, format="json")
    assert forward.json()["lag"] == 0

    bad = api.patch(f"{API}/{body['id']}", {"cursor": "forged"}, format="json")
    assert bad.status_code == 400
    assert bad.json()["pointer"] == "/cursor"
    assert api.patch(f"{API}/{body['id']}", {"cursor": 3}, format="json").status_code == 422


def test_delete_is_204_then_404(api, db, woken):
    body = create(api).json()
    assert api.delete(f"{API}/{body['id']}").status_code == 204
    assert api.get(f"{API}/{body['id']}").status_code == 404
    assert api.delete(f"{API}/{body['id']}").status_code == 404
    assert api.patch(f"{API}/{body['id']}", {"name": "x"}, format="json").status_code == 404


@pytest.mark.parametrize("bad_id", ["nope", "00000000-0000-0000-0000-000000000000"])
def test_unknown_subscription_is_404(api, db, bad_id):
    assert api.get(f"{API}/{bad_id}").status_code == 404


@pytest.mark.parametrize("who", ["maintainer", "staff"])
def test_only_superusers_manage_subscriptions(make_user, client_for, namespace, api, woken, who):
    # Old rule: staff managed subscriptions. Now superusers only; is_staff grants nothing.
    body = create(api).json()
    if who == "maintainer":
        user = make_user("mia", maintainer=[NS])
    else:
        user = make_user("sam", staff=True)
    other = client_for(user)
    item = f"{API}/{body['id']}"
    for response in (
        other.get(API),
        other.post(API, {"name": "x", "url": URL}, format="json"),
        other.get(item),
        other.patch(item, {"name": "y"}, format="json"),
        other.delete(item),
        other.post(f"{item}/rotate-secret"),
        other.post(f"{item}/retry"),
        other.post(f"{item}/skip"),
    ):
        assert response.status_code == 403
        assert response["Content-Type"] == "application/problem+json"
    anonymous = client_for(None)
    assert anonymous.get(API).status_code == 401
    for action in ("rotate-secret", "retry", "skip"):
        assert anonymous.post(f"{item}/{action}").status_code == 401
    stored = Subscription.objects.get(pk=body["id"])
    assert stored.name == "search index" and stored.secret == body["secret"]


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"name": "x"}, "/url"),
        ({"url": URL}, "/name"),
        ({"name": "", "url": URL}, "/name"),
        ({"name": "x", "url": "ftp://hooks.example.com/"}, "/url"),
        ({"name": "x", "url": "not a url"}, "/url"),
        ({"name": "x", "url": "http://"}, "/url"),
        ({"name": "x", "url": URL, "capture": "all"}, "/capture"),
        ({"name": "x", "url": URL, "active": "yes"}, "/active"),
        ({"name": "x", "url": URL, "namespaces": "acme.orders"}, "/namespaces"),
        ({"name": "x", "url": URL, "namespaces": ["Bad Name"]}, "/namespaces/0"),
        ({"name": "x", "url": URL, "namespaces": ["acme.none"]}, "/namespaces/0"),
        ({"name": "x", "url": URL, "start": "yesterday"}, "/start"),
        ({"name": "x", "url": URL, "secret": "mine"}, "/secret"),
    ],
)
def test_invalid_bodies_are_422_with_a_pointer(api, namespace, body, pointer):
    response = api.post(API, body, format="json")
    assert response.status_code == 422, response.content
    assert pointer in [e["pointer"] for e in response.json()["errors"]]
    assert not Subscription.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "http://[::1]/hook",
        "http://10.0.0.5/hook",
        "http://192.168.1.10/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://0.0.0.0/",
        "http://[::ffff:127.0.0.1]/",
        "https://intranet.example.com/hook",
    ],
)
def test_private_and_loopback_urls_are_refused_unless_allowed(api, db, settings, url, woken):
    response = create(api, url=url)
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/url"
    assert "ATLAS_ALLOW_PRIVATE_WEBHOOKS" in response.json()["errors"][0]["detail"]

    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    assert create(api, url=url).status_code == 201


def test_patching_to_a_private_url_is_refused(api, db, woken):
    body = create(api).json()
    response = api.patch(f"{API}/{body['id']}", {"url": "http://127.0.0.1/"}, format="json")
    assert response.status_code == 422
    assert Subscription.objects.get(pk=body["id"]).url == URL


def test_unresolvable_host_is_422(db):
    with pytest.raises(ValidationFailed, match="does not resolve"):
        check_webhook_url("http://no-such-host.invalid/hook")


def test_list_pages(api, db, woken):
    made = [create(api, name=f"s{i}").json()["id"] for i in range(5)]
    first = api.get(API, {"page_size": 2}).json()
    second = api.get(API, {"page_size": 2, "page_token": first["next_page_token"]}).json()
    third = api.get(API, {"page_size": 2, "page_token": second["next_page_token"]}).json()
    got = [s["id"] for page in (first, second, third) for s in page["results"]]
    assert got == made
    assert third["next_page_token"] is None
    assert api.get(API, {"page_token": "bad"}).status_code == 400


def test_create_is_idempotent_with_a_key(api, db, woken):
    first = api.post(API, {"name": "x", "url": URL}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = api.post(API, {"name": "x", "url": URL}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert Subscription.objects.count() == 1


def test_openapi_documents_the_feed_and_subscriptions(client, db):
    schema = yaml.safe_load(client.get("/api/schema/").content)
    paths = schema["paths"]
    assert {"get"} <= set(paths["/api/v1/changes"])
    assert {"get", "post"} <= set(paths["/api/v1/subscriptions"])
    assert {"get", "patch", "delete"} <= set(paths["/api/v1/subscriptions/{subscription_id}"])
    assert "201" in paths["/api/v1/subscriptions"]["post"]["responses"]
    assert "204" in paths["/api/v1/subscriptions/{subscription_id}"]["delete"]["responses"]


# --- Standard Webhooks secrets, rotation, parked deliveries ---------------------------------


def test_new_secrets_are_standard_webhooks_secrets(api, db, woken):
    import base64

    secret = create(api).json()["secret"]
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) == 32


def test_rotate_secret_returns_a_new_secret_and_the_overlap_end(api, db, settings, woken):
    from django.utils import timezone
    from django.utils.dateparse import parse_datetime

    settings.ATLAS_WEBHOOK_SECRET_OVERLAP_SECONDS = 600
    body = create(api).json()
    assert body["previous_secret_expires_at"] is None

    response = api.post(f"{API}/{body['id']}/rotate-secret")

    assert response.status_code == 200, response.content
    rotated = response.json()
    assert set(rotated) == FIELDS | {"secret"}
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != body["secret"]
    ends = parse_datetime(rotated["previous_secret_expires_at"])
    assert 590 <= (ends - timezone.now()).total_seconds() <= 600
    stored = Subscription.objects.get(pk=body["id"])
    assert (stored.secret, stored.previous_secret) == (rotated["secret"], body["secret"])
    shown = api.get(f"{API}/{body['id']}").json()
    assert "secret" not in shown
    assert shown["previous_secret_expires_at"] == rotated["previous_secret_expires_at"]
    assert api.post(f"{API}/{body['id']}/rotate-secret", {"x": 1}, format="json").status_code == 422
    assert api.post(f"{API}/nope/rotate-secret").status_code == 404


def test_parked_is_null_until_a_delivery_parks_then_shows_seq_error_attempts(
    api, root, namespace, write, woken
):
    from django.utils import timezone

    changeset = write(root, f"{NS}/order/a", {"n": 1}).changeset
    body = create(api).json()
    assert body["parked"] is None
    Subscription.objects.filter(pk=body["id"]).update(
        parked_seq=changeset.seq,
        parked_error="HTTP 500: boom",
        parked_attempts=20,
        parked_at=timezone.now(),
    )

    parked = api.get(f"{API}/{body['id']}").json()["parked"]

    assert parked["seq"] == changeset.seq and parked["part"] is None
    assert parked["error"] == "HTTP 500: boom" and parked["attempts"] == 20
    assert parked["at"]
    listed = api.get(API).json()["results"][0]
    assert listed["parked"] == parked


def test_retry_and_skip_through_the_api(api, root, namespace, write, woken):
    first = write(root, f"{NS}/order/a", {"n": 1}).changeset
    body = create(api).json()
    item = f"{API}/{body['id']}"
    for action in ("retry", "skip"):
        refused = api.post(f"{item}/{action}")
        assert refused.status_code == 409, refused.content
        assert refused["Content-Type"] == "application/problem+json"
    park = {"parked_seq": first.seq, "parked_error": "HTTP 410", "parked_attempts": 20}

    Subscription.objects.filter(pk=body["id"]).update(**park, consecutive_failures=20)
    retried = api.post(f"{item}/retry")
    assert retried.status_code == 200, retried.content
    assert retried.json()["parked"] is None
    assert retried.json()["consecutive_failures"] == 0
    assert feed.cursor_decode(retried.json()["cursor"]) == 0  # the same changeset again

    Subscription.objects.filter(pk=body["id"]).update(**park)
    skipped = api.post(f"{item}/skip")
    assert skipped.status_code == 200, skipped.content
    assert skipped.json()["parked"] is None
    assert feed.cursor_decode(skipped.json()["cursor"]) == first.seq
    assert f"skipped seq {first.seq} by root" in skipped.json()["last_error"]
    assert api.post(f"{API}/00000000-0000-0000-0000-000000000000/skip").status_code == 404


def test_moving_the_cursor_unparks(api, root, namespace, write, woken):
    first = write(root, f"{NS}/order/a", {"n": 1}).changeset
    body = create(api).json()
    Subscription.objects.filter(pk=body["id"]).update(parked_seq=first.seq, parked_error="x")
    moved = api.patch(
        f"{API}/{body['id']}", {"cursor": feed.cursor_encode(first.seq)}, format="json"
    )
    assert moved.status_code == 200 and moved.json()["parked"] is None


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::7f00:1",  # NAT64 (well-known prefix) of 127.0.0.1
        "64:ff9b::a00:5",  # NAT64 of 10.0.0.5
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b:1::a00:5",  # local-use NAT64 prefix
        "64:ff9b:1:ffff::808:808",  # local-use NAT64, whatever it embeds
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "::c0a8:10a",  # IPv4-compatible 192.168.1.10
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2002:a00:5::",  # 6to4 of 10.0.0.5
        "2001:0:4136:e378:8000:63bf:f5ff:fffa",  # Teredo, client 10.0.0.5
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
    ],
)
def test_ipv6_addresses_embedding_a_private_ipv4_are_refused_at_creation(
    api, db, settings, woken, address
):
    response = create(api, url=f"http://[{address}]/hook")
    assert response.status_code == 422, address
    assert response.json()["errors"][0]["pointer"] == "/url"
    with pytest.raises(ValidationFailed):
        check_webhook_url(f"https://[{address}]:8443/")
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    assert create(api, url=f"http://[{address}]/hook").status_code == 201


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::808:808",  # NAT64 of 8.8.8.8
        "2002:808:808::1",  # 6to4 of 8.8.8.8
        "2606:4700:4700::1111",  # a plain public IPv6 address
    ],
)
def test_ipv6_addresses_embedding_a_public_ipv4_are_accepted(api, db, woken, address):
    assert create(api, url=f"http://[{address}]/hook").status_code == 201


def test_openapi_documents_rotate_retry_and_skip(client, db):
    schema = yaml.safe_load(client.get("/api/schema/").content)
    paths = schema["paths"]
    for action in ("rotate-secret", "retry", "skip"):
        assert {"post"} <= set(paths[f"/api/v1/subscriptions/{{subscription_id}}/{action}"])
