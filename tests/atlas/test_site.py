"""Site-level checks: health, schema, migrations, and the read-only admin."""

from __future__ import annotations

import io

import pytest
import yaml
from django.core.management import call_command

from changesets.models import Changeset, Revision
from entities.models import Entity

pytestmark = pytest.mark.django_db


def test_healthz_and_readyz_answer_without_auth(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"]["database"] == "ok"


def test_metrics_are_prometheus_text(client, django_user_model):
    client.force_login(django_user_model.objects.create(username="root", is_superuser=True))
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")


def test_no_model_change_lacks_a_migration():
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)


CONTRACT_PATHS = {
    "/api/v1/entities": {"get"},
    "/api/v1/entities/{namespace}/{kind}/{slug}": {"get", "put", "patch", "delete"},
    "/api/v1/entities/{namespace}/{kind}/{slug}/history": {"get"},
    "/api/v1/batch": {"post"},
    "/api/v1/delete-by-query": {"post"},
    "/api/v1/changesets": {"get"},
    "/api/v1/changesets/{changeset_id}": {"get"},
    "/api/v1/changesets/{changeset_id}/revisions": {"get"},
    "/api/v1/namespaces": {"get", "post"},
    "/api/v1/namespaces/{name}": {"get", "patch"},
    "/api/v1/namespaces/{name}/grants/{principal_type}/{principal}": {"put", "delete"},
}


def test_openapi_schema_documents_every_endpoint(client):
    response = client.get("/api/schema/")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    for path, methods in CONTRACT_PATHS.items():
        assert path in schema["paths"], path
        assert methods <= set(schema["paths"][path]), path
    put = schema["paths"]["/api/v1/entities/{namespace}/{kind}/{slug}"]["put"]
    assert {"200", "201", "412", "422"} <= set(put["responses"])
    headers = {p["name"] for p in put["parameters"] if p["in"] == "header"}
    assert {"If-Match", "If-None-Match", "Idempotency-Key", "X-Atlas-Branch"} <= headers


def test_schema_generation_has_no_warnings():
    out, err = io.StringIO(), io.StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out, stderr=err)


@pytest.mark.parametrize("model", [Changeset, Revision, Entity])
def test_admin_never_offers_add_change_or_delete_of_the_log(admin_client, model, write, staff):
    from django.contrib import admin

    from entities.models import Namespace

    Namespace.objects.create(name="acme.orders")
    write(staff, "acme.orders/event/a", {"n": 1})
    model_admin = admin.site._registry[model]
    request = admin_client.get("/admin/").wsgi_request
    obj = model.objects.first()
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request, obj)
    assert not model_admin.has_delete_permission(request, obj)
    opts = model._meta
    changelist = admin_client.get(f"/admin/{opts.app_label}/{opts.model_name}/")
    assert changelist.status_code == 200
    detail = admin_client.get(f"/admin/{opts.app_label}/{opts.model_name}/{obj.pk}/change/")
    assert detail.status_code == 200  # viewable
    assert b'name="_save"' not in detail.content
    delete = admin_client.post(f"/admin/{opts.app_label}/{opts.model_name}/{obj.pk}/delete/")
    assert delete.status_code == 403
    assert model.objects.filter(pk=obj.pk).exists()
