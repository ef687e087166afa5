"""Keyset paging for every list: opaque, tamper-evident tokens, page-size parsing.

A token is a signed position (keyset paging), never an offset, so rows
landing during a traversal cause neither duplicates nor gaps. The signature's
salt names the listing and the user, so a token forged, edited, or carried to
another listing or another user is a 400. Each listing keeps only what is
its own: how to fetch rows after a position (a selector), what a row's
position is, and the filters its tokens are bound to (:func:`keyset_page`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from django.core import signing
from rest_framework import serializers
from rest_framework.request import Request

from atlas import replicas
from atlas.api.strict import QueryIntField, refuse_naming
from atlas.exceptions import BadRequest, ValidationFailed
from changesets.archive import boundary

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MSG_BAD_TOKEN = "The page token is invalid."
MSG_OTHER_LISTING = "The page token belongs to another listing."
T = TypeVar("T")


def _salt(scope: str, request: Request) -> str:
    return f"atlas.page.{scope}.{getattr(request.user, 'pk', '')}"


def encode_token(scope: str, request: Request, position: dict[str, Any]) -> str:
    """The signed token for ``position``.

    With read replicas configured it also records ``r``, the head seq of the
    server that served this page, read after its rows: the next page is served
    only by a server that has replayed that far (``atlas.replicas``), so a
    traversal never skips rows a lagging replica has not received yet.
    """
    if replicas.read_aliases():
        position = {**position, "r": replicas.served_seq()}
    return signing.dumps(position, salt=_salt(scope, request), compress=True)


def decode_token(scope: str, request: Request, token: str) -> dict[str, Any]:
    try:
        value = signing.loads(token, salt=_salt(scope, request))
    except signing.BadSignature as exc:
        raise BadRequest("The page token is invalid.", pointer="/page_token") from exc
    if not isinstance(value, dict):
        raise BadRequest("The page token is invalid.", pointer="/page_token")
    replayed = value.get("r")
    if type(replayed) is int:
        replicas.need_replayed(replayed)
    return value


def int_param(request: Request, name: str, *, default: int, maximum: int, minimum: int = 1) -> int:
    """A bounded integer query parameter (``page_size``), by the one integer rule
    (:class:`~atlas.api.strict.QueryIntField`): clamped above the maximum, 422 below 1.

    Not part of the views' query serializers: each listing reads it where it
    always did, some before their 404s (a changeset's ops) and some after.
    """
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return QueryIntField(maximum=maximum, minimum=minimum).run_validation(raw)
    except serializers.ValidationError as exc:
        [message] = cast(list[str], exc.detail)  # the field fails with one message
        refuse_naming(name, [{"pointer": f"/{name}", "detail": str(message)}])


def page_size(request: Request) -> int:
    return int_param(request, "page_size", default=DEFAULT_PAGE_SIZE, maximum=MAX_PAGE_SIZE)


def page_position(scope: str, request: Request) -> dict[str, Any] | None:
    token = request.query_params.get("page_token")
    if not token:
        return None
    return decode_token(scope, request, token)


def check_known_params(request: Request, allowed: set[str]) -> None:
    """Unknown query parameters are 422: a typo'd filter must not silently list everything."""
    unknown = sorted(set(request.query_params) - allowed - {"format"})
    if unknown:
        raise ValidationFailed(
            f"Unknown query parameter(s): {', '.join(unknown)}.",
            errors=[{"pointer": f"/{name}", "detail": "Unknown parameter."} for name in unknown],
        )


@dataclass(frozen=True)
class Page(Generic[T]):
    results: list[T]
    next_page_token: str | None


def resume_after(
    request: Request,
    *,
    scope: str,
    field: str,
    field_type: type,
    filters: dict[str, Any] | None = None,
) -> Any:
    """The position ``page_token`` resumes after (None on the first page).

    A token is ``{field: position, **filters}``: ``filters`` (a digest of the
    query, the changeset listed) must match the request's, or the token
    belongs to another listing (400). ``bool`` is never an ``int`` here.
    """
    position = page_position(scope, request)
    if position is None:
        return None
    after = position.get(field)
    wrong_filters = any(position.get(name) != value for name, value in (filters or {}).items())
    if wrong_filters or not _fits(after, field_type):
        raise BadRequest(MSG_OTHER_LISTING if filters else MSG_BAD_TOKEN, pointer="/page_token")
    return after


def _fits(after: Any, field_type: type) -> bool:
    """A list position is always an entity key, so it must be three strings to resume."""
    if type(after) is not field_type:
        return False
    if isinstance(after, list):
        return len(after) == 3 and all(type(part) is str for part in after)
    return True


def keyset_page(
    request: Request,
    *,
    scope: str,
    field: str,
    field_type: type,
    fetch: Callable[[Any, int], Iterable[T]],
    position_of: Callable[[T], Any],
    filters: dict[str, Any] | None = None,
    size: int | None = None,
) -> Page[T]:
    """One page of a keyset listing, and the token for the next (None on the last).

    ``fetch(after, limit)`` returns up to ``limit`` rows after the position
    ``after`` (None = from the start) in the listing's order; it is asked for
    one row more than the page holds, so a last page needs no second query.
    ``position_of(row)`` is the position a row is resumed after (a name, a
    seq, a key as a list). The token is signed for ``scope`` and the user.
    ``size`` is for a listing whose page size is not the usual one (a
    changeset's ops); the view parses it, so its 422 comes before a 404.
    """
    limit = page_size(request) if size is None else size
    after = resume_after(request, scope=scope, field=field, field_type=field_type, filters=filters)
    rows = list(fetch(after, limit + 1))
    token = None
    if len(rows) > limit:
        rows = rows[:limit]
        token = encode_token(scope, request, {field: position_of(rows[-1]), **(filters or {})})
    return Page(rows, token)


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "Page",
    "archived_page",
    "check_known_params",
    "decode_token",
    "encode_token",
    "int_param",
    "keyset_page",
    "page_position",
    "page_size",
    "resume_after",
]


def archived_page(body: dict[str, Any]) -> dict[str, Any]:
    """A listing's last page ends at the archive cut, and says so (``archived_before``:
    API.md "Archive and retention"); without a cut the body is unchanged."""
    if body.get("next_page_token") is None and (marker := boundary.marker()) is not None:
        body["archived_before"] = marker
    return body
