"""Resolve ``X-Atlas-Branch`` to an entity store."""

from __future__ import annotations

from rest_framework.request import Request

from atlas.exceptions import NotFound
from entities.store import EntityStore, baseline

BRANCH_HEADER = "X-Atlas-Branch"


def branch_name(request: Request) -> str:
    return (request.headers.get(BRANCH_HEADER) or "").strip()


def store_for(request: Request) -> EntityStore:
    """The baseline store, or the named branch's overlay (404 when unknown or invisible).

    Branch overlays arrive with the branches issue; until then every named
    branch is unknown.
    """
    name = branch_name(request)
    if not name:
        return baseline
    raise NotFound(f"Branch {name!r} not found.", pointer=f"/headers/{BRANCH_HEADER}")
