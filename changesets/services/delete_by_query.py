"""Delete every entity matching a query, as one changeset (rpc ``DeleteByQuery``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User

from atlas import conf
from atlas.exceptions import NotFound, PayloadTooLarge
from changesets.models import Rpc
from changesets.ops import DeleteOp
from changesets.services.apply import ApplyResult, changeset_apply
from entities import access
from entities.models import Namespace
from entities.store import EntityStore


@dataclass(frozen=True)
class DeleteByQueryResult:
    applied: ApplyResult
    deleted: int


def entities_delete_by_query(
    *,
    store: EntityStore,
    actor: User,
    namespace: str,
    kind: str | None = None,
    slug_prefix: str | None = None,
    comment: str = "",
    dry_run: bool = False,
    metadata: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
) -> DeleteByQueryResult:
    """Delete what matches ``namespace`` (and ``kind``, ``slug_prefix``) on ``store``.

    1. The namespace must exist and be readable (else 404: not visible = not
       found), and the actor must be allowed to write it on this store (403), checked
       before anything is listed, so a refused caller learns nothing by it.
    2. List the matches, at most ``ATLAS_MAX_BATCH_OPS`` (more → 413: narrow
       the query), like a batch of that many deletes.
    3. Delete them through :func:`changeset_apply`, its own transaction. The
       deletes are ``missing_ok``: an entity deleted between listing and
       applying is skipped, never a 404; one created meanwhile is not
       matched, as if the query had run a moment earlier.
    """
    row = Namespace.objects.filter(name=namespace).first()
    if row is None or not access.can_read(actor, namespace):
        raise NotFound(f"Namespace {namespace!r} not found.", pointer="/namespace")
    access.require_write(actor, {namespace: row}, branch=store.branch)
    limit = conf.get("ATLAS_MAX_BATCH_OPS")
    matches = store.list(
        namespaces=None,
        namespace=namespace,
        kind=kind,
        slug_prefix=slug_prefix,
        limit=limit + 1,
    )
    if len(matches) > limit:
        raise PayloadTooLarge(
            f"More than {limit} entities match; narrow the query (kind, slug_prefix).",
            pointer="/namespace",
        )
    result = changeset_apply(
        store=store,
        actor=actor,
        ops=[DeleteOp(e.key, missing_ok=True) for e in matches],
        rpc=Rpc.DELETE_BY_QUERY,
        comment=comment,
        dry_run=dry_run,
        metadata=metadata,
        context=context,
    )
    deleted = sum(1 for r in result.results if r.status == "deleted")
    return DeleteByQueryResult(applied=result, deleted=deleted)
