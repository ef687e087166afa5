"""What every entity endpoint resolves first: the key in the path, readability, as-of.

Shared by ``entities.api.views`` (reads and writes) and
``entities.api.history`` (history, blame, diff); how a pinned point is shown
is ``atlas.api.keys.as_of_repr``.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from rest_framework.request import Request

from atlas.api import paging
from atlas.api.keys import as_of_repr
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


def parse_as_of(request: Request) -> tuple[str | None, datetime | None] | None:
    """``as_of`` (a UUID) or ``as_of_time`` (a time), checked; None when neither is given."""
    raw_id = request.query_params.get("as_of")
    raw_time = request.query_params.get("as_of_time")
    if not raw_id and not raw_time:
        return None
    if raw_id and raw_time:
        raise ValidationFailed(
            "Give as_of or as_of_time, not both.",
            errors=[{"pointer": "/as_of_time", "detail": "Conflicts with as_of."}],
        )
    if raw_id:
        try:
            return str(uuid.UUID(raw_id)), None
        except ValueError as exc:
            raise ValidationFailed(
                "as_of must be a changeset id (UUID).",
                errors=[{"pointer": "/as_of", "detail": "Not a UUID."}],
            ) from exc
    if (at := parse_rfc3339(raw_time or "")) is None:
        raise ValidationFailed(
            "as_of_time must be an RFC 3339 timestamp with offset.",
            errors=[{"pointer": "/as_of_time", "detail": "Not an RFC 3339 timestamp."}],
        )
    return None, at


def pin_as_of(request: Request, store: EntityStore) -> Changeset | None:
    """Parse ``as_of`` / ``as_of_time``; the changeset the read is pinned to, or None."""
    parsed = parse_as_of(request)
    if parsed is None:
        return None
    changeset_id, at = parsed
    return asof.as_of_resolve(
        branch=store.branch,
        namespaces=access.readable_namespaces(request.user),
        changeset_id=changeset_id,
        at=at,
    )


def _is_as_of_block(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"changeset_id", "seq", "at"}
        and type(value["seq"]) is int
        and isinstance(value["changeset_id"], str)
        and isinstance(value["at"], str)
    )


def list_pin(request: Request, store: EntityStore) -> tuple[dict[str, Any] | None, list[Any]]:
    """The ``as_of`` block a list page is pinned to, and the point a token is bound to.

    Resolved once per traversal: the first page resolves ``as_of`` or
    ``as_of_time`` and its token carries the resolved block (signed for this
    user and bound to the same point), so later pages read from the token
    instead of resolving again. Resolving by time costs a seek, but a traversal
    of 10,000 entities is twenty pages.
    """
    parsed = parse_as_of(request)
    if parsed is None:
        return None, [None, None]
    changeset_id, at = parsed
    point = [changeset_id, at.astimezone(UTC).isoformat() if at else None]
    carried = paging.page_position("entities", request)
    block = carried.get("p") if carried else None
    if store.branch or not _is_as_of_block(block):
        block = as_of_repr(
            asof.as_of_resolve(
                branch=store.branch,
                namespaces=access.readable_namespaces(request.user),
                changeset_id=changeset_id,
                at=at,
            )
        )
    return block, point
