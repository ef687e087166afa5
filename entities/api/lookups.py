"""What every entity endpoint resolves first: the key in the path, readability, as-of.

Shared by ``entities.api.views`` (reads and writes) and
``entities.api.history`` (history, blame, diff); how a pinned point is shown
is ``atlas.api.keys.as_of_repr``.
"""

from __future__ import annotations

import uuid

from rest_framework.request import Request

from atlas.api.render import parse_rfc3339
from atlas.exceptions import NotFound, ValidationFailed
from changesets.models import Changeset
from changesets.selectors import asof
from entities import access
from entities import validation as v
from entities.store import EntityKey, EntityStore


def path_key(namespace: str, kind: str, slug: str) -> EntityKey:
    """An invalid name in the path names nothing that could exist: 404."""
    if not (v.is_valid_namespace(namespace) and v.is_valid_kind(kind) and v.is_valid_slug(slug)):
        raise NotFound("No such entity.")
    return EntityKey(namespace, kind, slug)


def require_readable(request: Request, namespace: str, what: str = "entity") -> None:
    if not access.can_read(request.user, namespace):
        raise NotFound(f"No such {what}.")


def pin_as_of(request: Request, store: EntityStore) -> Changeset | None:
    """Parse ``as_of`` / ``as_of_time``; the changeset the read is pinned to, or None."""
    raw_id = request.query_params.get("as_of")
    raw_time = request.query_params.get("as_of_time")
    if not raw_id and not raw_time:
        return None
    if raw_id and raw_time:
        raise ValidationFailed(
            "Give as_of or as_of_time, not both.",
            errors=[{"pointer": "/as_of_time", "detail": "Conflicts with as_of."}],
        )
    at = None
    if raw_id:
        try:
            uuid.UUID(raw_id)
        except ValueError as exc:
            raise ValidationFailed(
                "as_of must be a changeset id (UUID).",
                errors=[{"pointer": "/as_of", "detail": "Not a UUID."}],
            ) from exc
    elif (at := parse_rfc3339(raw_time or "")) is None:
        raise ValidationFailed(
            "as_of_time must be an RFC 3339 timestamp with offset.",
            errors=[{"pointer": "/as_of_time", "detail": "Not an RFC 3339 timestamp."}],
        )
    return asof.as_of_resolve(
        branch=store.branch,
        namespaces=access.readable_namespaces(request.user),
        changeset_id=raw_id or None,
        at=at,
    )
