"""Reads of the changeset log: history, lists, single changesets.

Every function takes the caller's readable namespaces (``None`` = all) and
filters by them, so visibility is decided in one place per query.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db.models import Prefetch, QuerySet

from changesets.models import BASELINE, Changeset, Revision
from entities.store import EntityKey

# Revision columns a changeset's op list needs; the JSON images stay unread.
OP_FIELDS = (
    "id",
    "changeset_id",
    "namespace",
    "kind",
    "slug",
    "op",
    "before_version",
    "after_version",
)


def entity_history(
    *, key: EntityKey, branch: str = BASELINE, before_seq: int | None = None, limit: int = 50
) -> list[Revision]:
    """One entity's revisions, newest first, off the ``revision_history`` index.

    Cost grows with the page, not with the size of the log.
    """
    qs = Revision.objects.filter(
        branch=branch, namespace=key.namespace, kind=key.kind, slug=key.slug
    )
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    return list(qs.select_related("changeset").order_by("-seq")[:limit])


def entity_has_history(*, key: EntityKey, branch: str = BASELINE) -> bool:
    return Revision.objects.filter(
        branch=branch, namespace=key.namespace, kind=key.kind, slug=key.slug
    ).exists()


def visible_changesets(namespaces: Sequence[str] | None) -> QuerySet[Changeset]:
    """Changesets with at least one op the caller can read (invariant 8)."""
    qs = Changeset.objects.all()
    if namespaces is not None:
        qs = qs.filter(namespaces__overlap=list(namespaces))
    return qs


def _ops_prefetch(namespaces: Sequence[str] | None) -> Prefetch:
    ops = Revision.objects.only(*OP_FIELDS).order_by("id")
    if namespaces is not None:
        ops = ops.filter(namespace__in=list(namespaces))
    return Prefetch("revisions", queryset=ops, to_attr="visible_ops")


def changeset_list(
    *,
    namespaces: Sequence[str] | None,
    branch: str | None = None,
    namespace: str | None = None,
    author: str | None = None,
    rpc: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before_seq: int | None = None,
    limit: int = 50,
) -> list[Changeset]:
    """Newest first by ``seq``; ``branch=None`` means every branch, ``""`` baseline."""
    qs = visible_changesets(namespaces)
    if branch is not None:
        qs = qs.filter(branch=branch)
    if namespace is not None:
        if namespaces is not None and namespace not in namespaces:
            # Filtering by an unreadable namespace must not reveal which
            # changesets touched it (invariant 8).
            return []
        qs = qs.filter(namespaces__contains=[namespace])
    if author is not None:
        qs = qs.filter(author_name=author)
    if rpc is not None:
        qs = qs.filter(rpc=rpc)
    if since is not None:
        qs = qs.filter(at__gte=since)
    if until is not None:
        qs = qs.filter(at__lte=until)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    return list(qs.order_by("-seq").prefetch_related(_ops_prefetch(namespaces))[:limit])


def changeset_get(*, changeset_id: str, namespaces: Sequence[str] | None) -> Changeset | None:
    """One changeset if the caller can read at least one of its ops; else None (404)."""
    return (
        visible_changesets(namespaces)
        .filter(pk=changeset_id)
        .prefetch_related(_ops_prefetch(namespaces))
        .first()
    )


def changeset_revisions(
    *, changeset: Changeset, namespaces: Sequence[str] | None
) -> list[Revision]:
    qs = Revision.objects.filter(changeset=changeset)
    if namespaces is not None:
        qs = qs.filter(namespace__in=list(namespaces))
    return list(qs.order_by("id"))
