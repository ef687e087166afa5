"""Provenance (API.md "Provenance"): ``metadata`` and ``context`` on every changeset,
through every surface, covered by the chain; X-Request-ID and trusted-proxy IPs."""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from atlas.api.provenance import client_ip, request_id_from, trusted_networks
from atlas.models import ApiToken
from changesets import chain
from changesets.models import Changeset, Rpc, Subscription
from changesets.ops import PutOp
from changesets.outbox import pumps
from changesets.outbox.subscriptions import subscription_create
from changesets.selectors.log import previous_hash
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.changesets.test_chain import _disable_guards, verify

pytestmark = pytest.mark.django_db

API = "/api/v1"
NS = "acme.orders"
NDJSON = "application/x-ndjson"
META = {"ticket": "OPS-42", "pipeline": {"run": 7, "ratio": 1.5, "tags": ["a", "é"]}}


@pytest.fixture
def api(writer, client_for):
    return client_for(writer)


def put(client: Any, slug: str, content: dict[str, Any], **extra: Any) -> Any:
    return client.put(f"{API}/entities/{NS}/order/{slug}", content, format="json", **extra)


def newest() -> Changeset:
    return Changeset.objects.order_by("-seq").first()


# --- the write: metadata stored, context recorded -----------------------------------------


def test_a_put_stores_metadata_and_the_request_context(api, writer):
    response = put(
        api,
        "a",
        {"content": {"n": 1}, "metadata": META},
        HTTP_X_REQUEST_ID="deploy-7:step.3",
        HTTP_USER_AGENT="atlas-tests/1.0",
        REMOTE_ADDR="198.51.100.7",
    )
    assert response.status_code == 201, response.content
    assert response["X-Request-ID"] == "deploy-7:step.3"
    cs = newest()
    token = ApiToken.objects.get(user=writer)
    assert cs.metadata == META
    assert cs.context == {
        "request_id": "deploy-7:step.3",
        "ip": "198.51.100.7",
        "user_agent": "atlas-tests/1.0",
        "auth": "token",
        "token_id": token.pk,
    }
    shown = response.json()["changeset"]
    assert shown["metadata"] == META and shown["context"] == cs.context
    assert verify() is None


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("patch", f"/entities/{NS}/order/a", {"patch": {"m": 2}}),
        ("delete", f"/entities/{NS}/order/a", {}),
        (
            "post",
            "/batch",
            {
                "ops": [
                    {
                        "op": "put",
                        "namespace": NS,
                        "kind": "order",
                        "slug": "b",
                        "content": {"x": 1},
                    }
                ]
            },
        ),
        ("post", "/delete-by-query", {"namespace": NS}),
    ],
)
def test_every_entity_write_body_accepts_metadata(api, method, path, body):
    put(api, "a", {"content": {"n": 1}})
    response = getattr(api, method)(
        f"{API}{path}", {**body, "metadata": {"via": method}}, format="json"
    )
    assert response.status_code == 200, response.content
    cs = newest()
    assert cs.metadata == {"via": method}
    assert cs.context["auth"] == "token" and cs.context["request_id"] == response["X-Request-ID"]


def test_revert_and_merge_accept_metadata(staff, namespace, client_for):
    api = client_for(staff)
    put(api, "a", {"content": {"n": 1}})
    response = api.post(
        f"{API}/changesets/{newest().id}/revert", {"metadata": {"why": "undo"}}, format="json"
    )
    assert response.status_code == 200, response.content
    assert newest().rpc == Rpc.REVERT_CHANGESET and newest().metadata == {"why": "undo"}
    assert api.post(f"{API}/branches", {"name": "feat"}, format="json").status_code == 201
    put(api, "b", {"content": {"n": 2}}, HTTP_X_ATLAS_BRANCH="feat")
    response = api.post(f"{API}/branches/feat/merge", {"metadata": {"why": "ship"}}, format="json")
    assert response.status_code == 200, response.content
    merged = newest()
    assert merged.rpc == Rpc.MERGE_BRANCH and merged.metadata == {"why": "ship"}
    assert merged.context["auth"] == "token"
    assert verify() is None


def test_a_service_write_records_a_system_context(staff, namespace):
    cs = changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(EntityKey(NS, "order", "s"), {})], rpc="PutEntity"
    ).changeset
    assert Changeset.objects.get(pk=cs.pk).context == {"auth": "system"}
    assert Changeset.objects.get(pk=cs.pk).metadata is None


def test_a_session_write_says_session(writer, namespace):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_login(writer)
    response = put(client, "a", {"content": {"n": 1}})
    assert response.status_code == 201, response.content
    assert newest().context["auth"] == "session" and "token_id" not in newest().context


# --- metadata limits -----------------------------------------------------------------------


def test_metadata_over_4_kib_is_413_and_writes_nothing(api):
    before = Changeset.objects.count()
    response = put(api, "a", {"content": {"n": 1}, "metadata": {"blob": "x" * 4090}})
    assert response.status_code == 413
    assert response["Content-Type"].startswith("application/problem+json")
    assert Changeset.objects.count() == before
    # Exactly 4096 bytes of compact JSON is within the limit (multi-byte text counted in bytes).
    exact = {"b": "é" * ((4096 - len('{"b":""}')) // 2)}
    assert len(json.dumps(exact, ensure_ascii=False, separators=(",", ":")).encode()) == 4096
    assert put(api, "a", {"content": {"n": 1}, "metadata": exact}).status_code == 201


@pytest.mark.parametrize(
    ("metadata", "pointer"),
    [
        ([1, 2], "/metadata"),
        ("text", "/metadata"),
        (7, "/metadata"),
        ({"a": {"b": "nul\u0000"}}, "/metadata/a/b"),
    ],
)
def test_metadata_that_is_not_a_storable_object_is_422(api, metadata, pointer):
    response = put(api, "a", {"content": {"n": 1}, "metadata": metadata})
    assert response.status_code == 422, response.content
    assert response["Content-Type"].startswith("application/problem+json")
    assert pointer in [e["pointer"] for e in response.json()["errors"]]


def test_null_or_empty_metadata_is_none(api):
    assert put(api, "a", {"content": {"n": 1}, "metadata": None}).status_code == 201
    assert newest().metadata is None
    assert put(api, "a", {"content": {"n": 2}, "metadata": {}}).status_code == 200
    assert newest().metadata is None
    assert api.get(f"{API}/changesets/{newest().id}").json()["metadata"] == {}


# --- X-Request-ID ----------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["a", "A-z_0.9:x", "x" * 200])
def test_a_well_formed_request_id_is_echoed(api, given):
    response = api.get(f"{API}/changes", HTTP_X_REQUEST_ID=given)
    assert response["X-Request-ID"] == given
    assert request_id_from(given) == given


@pytest.mark.parametrize("given", [None, "", "x" * 201, "has space", "semi;colon", "é", "a\tb"])
def test_anything_else_is_replaced_by_a_generated_id(api, given):
    extra = {} if given is None else {"HTTP_X_REQUEST_ID": given}
    response = put(api, "a", {"content": {"n": 1}}, **extra)
    echoed = response["X-Request-ID"]
    assert echoed != given and uuid.UUID(echoed).version == 7
    assert newest().context["request_id"] == echoed


def test_errors_and_pages_outside_the_api_echo_it_too(api, client):
    assert api.get(f"{API}/entities/{NS}/order/none", HTTP_X_REQUEST_ID="r1")["X-Request-ID"] == (
        "r1"
    )
    assert client.get("/healthz", HTTP_X_REQUEST_ID="r2")["X-Request-ID"] == "r2"


# --- the client's IP: X-Forwarded-For only from trusted proxies ------------------------------


def nets(*entries: str) -> Any:
    from atlas.api.provenance import _networks

    return _networks(entries)


@pytest.mark.parametrize(
    ("peer", "xff", "trusted", "expected"),
    [
        # no trusted proxies: the header is ignored, whoever sends it
        ("203.0.113.5", "1.2.3.4", (), "203.0.113.5"),
        # an untrusted peer's header is ignored
        ("203.0.113.5", "1.2.3.4", ("10.0.0.0/8",), "203.0.113.5"),
        # a trusted peer: the address it received the request from
        ("10.0.0.2", "198.51.100.9", ("10.0.0.0/8",), "198.51.100.9"),
        # several hops: the right-most untrusted one, not the client's claim on the left
        ("10.0.0.2", "6.6.6.6, 198.51.100.9, 10.0.0.7", ("10.0.0.0/8",), "198.51.100.9"),
        ("10.0.0.2", "6.6.6.6,198.51.100.9,10.1.2.3", ("10.0.0.2", "10.1.0.0/16"), "198.51.100.9"),
        # every hop trusted: the furthest one
        ("10.0.0.2", "10.0.0.9, 10.0.0.8", ("10.0.0.0/8",), "10.0.0.9"),
        # garbage ends the walk at the last good address
        ("10.0.0.2", "198.51.100.9, not-an-ip", ("10.0.0.0/8",), "10.0.0.2"),
        ("10.0.0.2", "garbage, 10.0.0.7", ("10.0.0.0/8",), "10.0.0.7"),
        ("10.0.0.2", "", ("10.0.0.0/8",), "10.0.0.2"),
        # IPv6
        ("::1", "2001:db8::5", ("::1/128",), "2001:db8::5"),
        ("2001:db8::1", "2001:db8::5", ("10.0.0.0/8",), "2001:db8::1"),
    ],
)
def test_client_ip(peer, xff, trusted, expected):
    assert client_ip(peer, xff, nets(*trusted)) == expected


def test_the_setting_drives_the_recorded_ip(api, settings):
    headers = {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 198.51.100.9"}
    put(api, "a", {"content": {"n": 1}}, **headers)
    assert newest().context["ip"] == "10.0.0.2"  # default: no proxy trusted
    settings.ATLAS_TRUSTED_PROXIES = ["10.0.0.0/8"]
    assert trusted_networks() == nets("10.0.0.0/8")
    put(api, "a", {"content": {"n": 2}}, **headers)
    assert newest().context["ip"] == "198.51.100.9"


# --- every surface ---------------------------------------------------------------------------


def test_changeset_endpoints_and_the_feed_show_them(api, staff, client_for):
    put(api, "a", {"content": {"n": 1}, "metadata": META}, HTTP_X_REQUEST_ID="rid-1")
    cs = newest()
    admin_api = client_for(staff)
    one = admin_api.get(f"{API}/changesets/{cs.id}").json()
    listed = admin_api.get(f"{API}/changesets").json()["results"][0]
    [record] = admin_api.get(f"{API}/changes").json()["records"]
    for shown in (one, listed, record):
        assert shown["metadata"] == META
        assert shown["context"]["request_id"] == "rid-1"
        assert shown["context"]["auth"] == "token"


def test_a_reader_of_only_some_namespaces_sees_neither(make_user, staff, namespace, client_for):
    make_user("other", writer=["acme.other"])
    ops = [PutOp(EntityKey(NS, "order", "a"), {}), PutOp(EntityKey("acme.other", "o", "b"), {})]
    cs = changeset_apply(
        store=baseline, actor=staff, ops=ops, rpc=Rpc.BATCH_MUTATE, metadata={"secret": 1}
    ).changeset
    reader = make_user("rita", reader=[NS])
    body = client_for(reader).get(f"{API}/changesets/{cs.id}").json()
    assert "metadata" not in body and "context" not in body and "comment" not in body


def test_a_webhook_body_carries_them(staff, namespace, receivers, webhook_settings):
    receiver = receivers()
    sub = subscription_create(actor=None, name="t", url=receiver.url)
    changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(EntityKey(NS, "order", "w"), {"n": 1})],
        rpc=Rpc.PUT_ENTITY,
        metadata={"hook": True},
        context={"request_id": "r-w", "ip": "192.0.2.1", "user_agent": "", "auth": "token"},
    )
    assert pumps.subscription_pump(subscription_id=str(sub.id)) == "idle"
    [got] = receiver.deliveries
    [record] = got.records
    assert record["metadata"] == {"hook": True}
    assert record["context"]["request_id"] == "r-w" and record["context"]["ip"] == "192.0.2.1"
    assert Subscription.objects.get(pk=sub.pk).deliveries_ok == 1


def test_ndjson_export_carries_them_and_import_keeps_metadata_not_context(
    staff, namespace, client_for
):
    api = client_for(staff)
    put(api, "a", {"content": {"n": 1}, "metadata": META}, HTTP_X_REQUEST_ID="exported")
    source = newest()
    text = b"".join(api.get(f"{API}/changesets/{source.id}/export").streaming_content).decode()
    envelope = json.loads(text.split("\n")[0])
    assert envelope["metadata"] == META and envelope["context"]["request_id"] == "exported"
    # Import it elsewhere: the entity is gone first so the file's create applies.
    api.delete(f"{API}/entities/{NS}/order/a", format="json")
    response = api.post(
        f"{API}/changesets/import", data=text, content_type=NDJSON, HTTP_X_REQUEST_ID="importer"
    )
    assert response.status_code == 200, response.content
    imported = newest()
    assert imported.rpc == Rpc.IMPORT_CHANGESET
    assert imported.metadata == META
    assert imported.context["request_id"] == "importer"
    assert verify() is None


@pytest.mark.parametrize("with_provenance", [True, False])
def test_import_accepts_envelopes_with_or_without_provenance(
    staff, namespace, client_for, with_provenance
):
    envelope: dict[str, Any] = {
        "schema_version": 2,
        "changeset_id": str(uuid.uuid4()),
        "author": "someone",
        "at": "2024-01-01T00:00:00.000Z",
        "rpc": "PutEntity",
        "branch": "",
        "comment": "",
    }
    if with_provenance:
        envelope["metadata"] = {"k": "v"}
        envelope["context"] = {"auth": "token", "ip": "203.0.113.1"}
    op = {
        "op": "create",
        "namespace": NS,
        "kind": "order",
        "slug": "i",
        "before": None,
        "after": {"n": 1},
    }
    text = json.dumps(envelope) + "\n" + json.dumps(op) + "\n"
    response = client_for(staff).post(f"{API}/changesets/import", data=text, content_type=NDJSON)
    assert response.status_code == 200, response.content
    assert newest().metadata == ({"k": "v"} if with_provenance else None)
    assert newest().context["auth"] == "token" and newest().context.get("ip") != "203.0.113.1"


@pytest.mark.parametrize(
    ("field", "value", "status"),
    [("metadata", [1], 400), ("metadata", {"b": "x" * 5000}, 413), ("context", "x", 400)],
)
def test_import_checks_the_envelope_provenance(staff, namespace, client_for, field, value, status):
    envelope = {
        "schema_version": 2,
        "changeset_id": str(uuid.uuid4()),
        "author": "someone",
        "at": "2024-01-01T00:00:00.000Z",
        "rpc": "PutEntity",
        "branch": "",
        "comment": "",
        field: value,
    }
    op = {
        "op": "create",
        "namespace": NS,
        "kind": "order",
        "slug": "i",
        "before": None,
        "after": {"n": 1},
    }
    text = json.dumps(envelope) + "\n" + json.dumps(op) + "\n"
    response = client_for(staff).post(f"{API}/changesets/import", data=text, content_type=NDJSON)
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/problem+json")


def test_the_admin_changeset_page_shows_them(api, staff, client):
    put(
        api,
        "a",
        {"content": {"n": 1}, "metadata": {"ticket": "<OPS-1>"}},
        HTTP_X_REQUEST_ID="admin-rid",
        HTTP_USER_AGENT="curl/8",
    )
    cs = newest()
    client.force_login(staff)
    page = client.get(f"/admin/changesets/changeset/{cs.id}/change/").content.decode()
    assert "admin-rid" in page and "curl/8" in page
    assert "&lt;OPS-1&gt;" in page and "<OPS-1>" not in page  # escaped


# --- the chain ---------------------------------------------------------------------------------


def _v1_hash(prev: str, cs: Changeset, revisions_hex: str) -> str:
    """The header as it was hashed before provenance (no metadata, no context members)."""
    header = {
        "id": str(cs.id),
        "author": cs.author_name,
        "message": cs.message,
        "comment": cs.comment,
        "branch": cs.branch,
        "rpc": str(cs.rpc),
        "op_count": cs.op_count,
        "namespaces": list(cs.namespaces),
        "revisions": revisions_hex,
        "seq": cs.seq,
        "at": cs.at.isoformat(timespec="microseconds"),
    }
    digest = hashlib.sha256(chain.VERSION)
    digest.update(prev.encode())
    digest.update(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    return digest.hexdigest()


def test_a_changeset_without_provenance_hashes_as_before(staff, namespace):
    cs = changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(EntityKey(NS, "order", "o"), {})], rpc="PutEntity"
    ).changeset
    cs = Changeset.objects.get(pk=cs.pk)
    cs.metadata, cs.context = None, None
    assert chain.changeset_hash(prev_hash="p", changeset=cs, revisions_hex="r") == _v1_hash(
        "p", cs, "r"
    )


def test_postgresql_hashes_provenance_as_verify_recomputes_it(api):
    odd = {"é": "漢字 😀 \u2028", "q": 'quote " \\', "n": [1e16, 0.1, -0.0, 1.0, True, None]}
    assert (
        put(
            api, "a", {"content": {"n": 1}, "metadata": odd}, HTTP_USER_AGENT='ua "quoted" é'
        ).status_code
        == 201
    )
    assert verify() is None


def _old_style_changeset(staff) -> Changeset:
    """A changeset as written before 0015: no metadata, no context, hashed without them."""
    cs = changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(EntityKey(NS, "order", "old"), {})], rpc="PutEntity"
    ).changeset
    with connection.cursor() as cursor:
        _disable_guards(cursor)
        cs = Changeset.objects.get(pk=cs.pk)
        cs.metadata = cs.context = None
        from changesets.models import Revision

        revisions = list(Revision.objects.filter(changeset=cs).order_by("id"))
        new_hash = chain.changeset_hash(
            prev_hash=previous_hash(cs),
            changeset=cs,
            revisions_hex=chain.revisions_digest(revisions),
        )
        cursor.execute(
            "UPDATE changesets_changeset SET metadata = NULL, context = NULL,"
            " hash = decode(%s, 'hex') WHERE id = %s",
            [new_hash, cs.pk],
        )
        cursor.execute(
            "UPDATE changesets_loghead SET hash = decode(%s, 'hex') WHERE id = 1", [new_hash]
        )
        cursor.execute("ALTER TABLE changesets_changeset ENABLE TRIGGER changeset_append_only")
        cursor.execute("ALTER TABLE changesets_revision ENABLE TRIGGER revision_append_only")
    return cs


@pytest.fixture
def mixed_log(staff, namespace, client_for):
    """An old-style changeset (seq 1), then new ones with provenance (seq 2, 3)."""
    _old_style_changeset(staff)
    api = client_for(staff)
    put(api, "a", {"content": {"n": 1}, "metadata": {"t": 1}})
    put(api, "b", {"content": {"n": 1}})
    assert verify() is None
    return api


TAMPERS = {
    "metadata edited": "UPDATE changesets_changeset SET metadata = '{\"t\": 2}' WHERE seq = 2",
    "metadata removed": "UPDATE changesets_changeset SET metadata = NULL WHERE seq = 2",
    "metadata added": "UPDATE changesets_changeset SET metadata = '{\"x\": 1}' WHERE seq = 3",
    "metadata added to an old one": (
        "UPDATE changesets_changeset SET metadata = '{\"x\": 1}' WHERE seq = 1"
    ),
    "context ip edited": (
        "UPDATE changesets_changeset SET context = jsonb_set(context, '{ip}', '\"1.1.1.1\"')"
        " WHERE seq = 3"
    ),
    "context removed": "UPDATE changesets_changeset SET context = NULL WHERE seq = 2",
    "context added to an old one": (
        'UPDATE changesets_changeset SET context = \'{"auth": "system"}\' WHERE seq = 1'
    ),
}


def test_the_old_and_new_changesets_verify_together(mixed_log):
    out = io.StringIO()
    call_command("verify_log", "--no-progress", stdout=out)
    assert out.getvalue().startswith("ok: 3 changeset(s) verified")


@pytest.mark.parametrize("what", list(TAMPERS))
def test_tampering_with_provenance_is_detected_by_verify_log(mixed_log, what):
    sid = transaction.savepoint()
    with connection.cursor() as cursor:
        _disable_guards(cursor)
        cursor.execute(TAMPERS[what])
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("verify_log", "--no-progress", stderr=err)
    assert exited.value.code == 1
    assert "hash does not match the rows (edited)" in err.getvalue()
    transaction.savepoint_rollback(sid)
