"""The host's own view: its row and an Atlas changeset, in one transaction of its own."""

import json

from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_POST

from changesets.models import Rpc
from changesets.ops import PutOp
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from shop.models import Order


@require_POST
@login_required
def place_order(request: HttpRequest) -> HttpResponse:
    body = json.loads(request.body)
    key = EntityKey("shop.orders", "order", body["number"])
    with transaction.atomic():
        result = changeset_apply(
            store=baseline,
            actor=request.user,
            ops=[PutOp(key, {"total": body["total"], "status": "placed"})],
            rpc=Rpc.PUT_ENTITY,
            comment="placed in the shop",
        )
        order = Order.objects.create(
            number=body["number"], total=body["total"], changeset_id=result.changeset.id
        )
    return JsonResponse({"order": order.pk, "changeset_id": str(order.changeset_id)}, status=201)
