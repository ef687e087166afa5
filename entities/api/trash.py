"""``GET /entities?deleted=true``: the trash, one keyset page at a time.

Entities whose newest baseline revision is a delete, in (namespace, kind,
slug) order, each with what the delete removed (``content``,
``last_version``) and who deleted it when (``deleted_by``). Restore brings
one back (``POST /entities/{ns}/{kind}/{slug}/restore`` with that version).
"""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import paging
from atlas.api.branch import BRANCH_HEADER
from atlas.exceptions import BadRequest, ValidationFailed
from changesets.selectors.restore import deleted_entities
from entities import access
from entities.api.serializers import deleted_entity_repr
from entities.store import EntityKey, EntityStore

MSG_TRASH_BASELINE = "The trash lists baseline deletes only; drop the branch header."
MSG_TRASH_NOW = "deleted=true lists the trash as it is now; drop as_of and as_of_time."


def trash_page(
    request: Request,
    store: EntityStore,
    *,
    namespace: str | None,
    kind: str | None,
    prefix: str | None,
) -> Response:
    """One page of the trash for the caller's readable namespaces.

    Baseline only (a branch's deletes are tombstones in its overlay, merged or
    abandoned with it): with the branch header, 400. It lists the present, so
    ``as_of``/``as_of_time`` beside it are a 422.
    """
    if store.branch:
        raise BadRequest(MSG_TRASH_BASELINE, pointer=f"/headers/{BRANCH_HEADER}")
    for name in ("as_of", "as_of_time"):
        if request.query_params.get(name):
            raise ValidationFailed(
                MSG_TRASH_NOW,
                pointer=f"/{name}",
                errors=[{"pointer": f"/{name}", "detail": MSG_TRASH_NOW}],
            )
    readable = access.readable_namespaces(request.user)
    page = paging.keyset_page(
        request,
        scope="trash",
        field="k",
        field_type=list,
        filters={"f": [namespace, kind, prefix]},
        fetch=lambda after, limit: deleted_entities(
            namespaces=readable,
            namespace=namespace,
            kind=kind,
            slug_prefix=prefix,
            after=EntityKey(*after) if after is not None else None,
            limit=limit,
        ),
        position_of=lambda e: [e.key.namespace, e.key.kind, e.key.slug],
    )
    return Response(
        {
            "results": [deleted_entity_repr(e) for e in page.results],
            "next_page_token": page.next_page_token,
        }
    )
