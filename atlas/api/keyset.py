"""One keyset page of any listing: ``page_of`` (API.md Conventions, Paging).

Every paged list in the changesets and branches APIs had the same six lines
written by hand: decode the token, fetch ``size + 1`` rows after its
position, cut, sign the last row's position. Here once. The listing keeps
what is its own: how to fetch rows after a key (a selector), what a row's
position is, and which positions are valid for it. Token formats are those
the views signed before, so tokens already handed out keep working.

A stand-in with the shape of the shared helper in ``atlas/api/paging.py``;
it uses that module's signing, so the two can be swapped at merge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rest_framework.request import Request

from atlas.api import paging
from atlas.exceptions import BadRequest

T = TypeVar("T")
MSG_INVALID = "The page token is invalid."
MSG_OTHER_LISTING = "The page token belongs to another listing."


@dataclass(frozen=True)
class Page(Generic[T]):
    rows: list[T]
    next_token: str | None


def refuse_token(message: str = MSG_INVALID) -> BadRequest:
    """The 400 for a page token that is signed but does not fit this listing."""
    return BadRequest(message, pointer="/page_token")


def page_of(
    rows_after: Callable[[Any, int], Iterable[T]],
    key: Callable[[T], dict[str, Any]],
    request: Request,
    *,
    scope: str,
    resume: Callable[[dict[str, Any]], Any],
    size: int | None = None,
) -> Page[T]:
    """The page of ``rows_after(after, limit)`` that ``request``'s ``page_token`` asks for.

    1. ``page_token`` absent: start at the beginning (``after=None``); present:
       its signed position (400 when forged or from another listing or user)
       goes through ``resume``, which returns the key to continue after or
       raises (see :func:`refuse_token`).
    2. One row more than the page is fetched, so "is there another page"
       costs no count query.
    3. The next token is the last row's ``key`` signed for ``scope``.
    """
    limit = paging.page_size(request) if size is None else size
    position = paging.page_position(scope, request)
    after = None if position is None else resume(position)
    rows = list(rows_after(after, limit + 1))
    if len(rows) <= limit:
        return Page(rows, None)
    rows = rows[:limit]
    return Page(rows, paging.encode_token(scope, request, key(rows[-1])))
