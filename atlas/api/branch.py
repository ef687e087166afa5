"""Resolve ``X-Atlas-Branch`` to an entity store."""

from __future__ import annotations

from django.contrib.auth.models import User
from rest_framework.request import Request

from atlas.api.auth import actor
from atlas.exceptions import NotFound
from branches.selectors import branch_get
from branches.store import BranchStore
from entities.store import EntityStore, baseline

BRANCH_HEADER = "X-Atlas-Branch"


def branch_name(request: Request) -> str:
    return (request.headers.get(BRANCH_HEADER) or "").strip()


def store_for(request: Request) -> EntityStore:
    """The baseline store, or the named branch's overlay (404 when unknown or invisible).

    Header absent (or empty) = baseline. A branch is visible to its creator,
    its members, superusers, and readers of any namespace it has written; an
    invalid name, a missing branch and an invisible one all answer the same
    404, with the header as the pointer. Closed (merged, abandoned) branches
    resolve too: reads work, writes are refused with 409 by the store.

    The store writes on behalf of the request's user: its ``lock`` refuses
    (403) a user who may see but not write the branch (not its creator, a
    member, a superuser or a maintainer of every namespace it touches), so
    every write path (entity writes, batch, delete-by-query, revert, import)
    obeys the same rule under the branch row lock.
    """
    return store_named(branch_name(request), user=actor(request))


def store_named(name: str, *, user: User) -> EntityStore:
    """:func:`store_for` by name: "" is baseline (the MCP tools' ``branch`` argument)."""
    if not name:
        return baseline
    branch = branch_get(name=name, user=user)
    if branch is None:
        raise NotFound(f"Branch {name!r} not found.", pointer=f"/headers/{BRANCH_HEADER}")
    return BranchStore(branch, writer=user)
