"""Drive the host project the way its users would and print what happened, as JSON.

Run by ``tests/atlas/test_host_project.py`` after ``migrate``, from a fresh
virtualenv holding Atlas's wheel; that test asserts on the report.
"""

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import IntegrityError, ProgrammingError, transaction
from django.test import Client

import atlas
from atlas.services import api_token_create
from changesets.models import Changeset
from entities.models import Entity
from entities.services import namespace_create, role_grant

PREFIX = "/records/api/v1"


class Command(BaseCommand):
    help = "Exercise Atlas inside this host project; print a JSON report."

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        root = users.objects.create_superuser("root", "root@example.com", "pw")
        clerk = users.objects.create_user("clerk")
        auditor = users.objects.create_user("auditor")
        namespace = namespace_create(name="shop.orders")
        role_grant(namespace=namespace, principal=clerk, role="writer")
        role_grant(namespace=namespace, principal=auditor, role="reader")
        report: dict[str, Any] = {"atlas_file": atlas.__file__}

        shop = Client()
        shop.force_login(clerk)
        placed = shop.post(
            "/shop/orders/", {"number": "o-1", "total": 42}, content_type="application/json"
        )
        report["place"] = [placed.status_code, placed.json()]
        try:  # the host's own row fails after Atlas wrote: both roll back together
            shop.post(
                "/shop/orders/", {"number": "o-1", "total": 7}, content_type="application/json"
            )
            report["duplicate"] = "accepted"
        except IntegrityError:
            report["duplicate"] = "rolled back"
        report["changesets"] = list(Changeset.objects.values_list("author_name", "comment"))

        key = api_token_create(user=auditor, name="report")[1]
        api = Client(HTTP_AUTHORIZATION=f"Token {key}")
        history = api.get(f"{PREFIX}/entities/shop.orders/order/o-1/history")
        report["history"] = [history.status_code, history.json()]
        changeset_id = placed.json()["changeset_id"]
        one = api.get(f"{PREFIX}/changesets/{changeset_id}")
        report["changeset"] = [one.status_code, one.json()]
        report["anonymous"] = Client().get(f"{PREFIX}/changesets").status_code
        report["schema"] = api.get("/records/api/schema/").status_code

        admin = Client()
        admin.force_login(root)
        report["admin"] = {
            path: [page.status_code, changeset_id in page.content.decode()]
            for path in (
                "/admin/",
                "/admin/changesets/changeset/",
                f"/admin/changesets/changeset/{changeset_id}/change/",
                "/admin/entities/entity/",
                "/admin/shop/order/",
            )
            for page in [admin.get(path)]
        }

        try:
            with transaction.atomic():
                Entity.objects.filter(slug="o-1").update(content={"total": 0})
            report["direct_write"] = "accepted"
        except ProgrammingError as exc:
            report["direct_write"] = str(exc).splitlines()[0]
        report["entity"] = list(Entity.objects.values_list("slug", "content", "version"))
        self.stdout.write(json.dumps(report, default=str))
