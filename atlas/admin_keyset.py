"""Keyset paging for admin changelists over logs of millions of rows (issue 18).

Django's changelist pages with ``OFFSET`` and counts the matches: page 2,000
of the changeset log read 100,000 rows to skip them, and every page paid for
a count. Here a page is "the ``list_per_page`` newest rows below a position",
read off an index in its order whatever the depth, and nothing is counted:

- ``?before=<key>``: the next older page (rows whose key is below it);
- ``?after=<key>``: the next newer page (read upwards, shown newest first);
- neither: the newest page.

The key is one column that only rises (``seq``, or a UUIDv7 primary key), optionally with a
unique tiebreak (``id``) where the column repeats (a changeset's revisions
share its seq): ``before=<seq>`` or ``before=<seq>.<id>``. The bound is
written ``seq <= s AND (seq < s OR id < i)``, so the index on ``seq`` starts
at ``s`` and the tiebreak only filters the rows of that one seq.

A search may stop before it has a full page (it examines a bounded number of
candidates per request: ``changesets.admin.search``); it then sets
``request.atlas_keyset_resume`` to where it stopped, and the page offers
"older" from there, so every match stays reachable.
"""

from __future__ import annotations

import uuid
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.http import HttpRequest

BEFORE, AFTER = "before", "after"

Key = tuple[Any, ...]


def _part(raw: str) -> int | uuid.UUID | None:
    if raw.isdigit() and len(raw) <= 18:
        return int(raw)
    try:
        return uuid.UUID(raw)
    except ValueError:
        return None


def parse_key(raw: str | None, width: int) -> Key | None:
    """``"12"``, ``"12.345"`` or a UUID as a key of ``width`` parts; None if malformed."""
    if not raw:
        return None
    parts = [_part(p) for p in raw.split(".")]
    if len(parts) != width or any(p is None for p in parts):
        return None
    return tuple(parts)


def format_key(key: Key) -> str:
    return ".".join(str(k) for k in key)


def page_position(request: HttpRequest, width: int) -> tuple[str, Key | None]:
    """(direction, key) asked for by the request: ``("before", None)`` is the newest page."""
    after = parse_key(request.GET.get(AFTER), width)
    if after is not None:
        return AFTER, after
    return BEFORE, parse_key(request.GET.get(BEFORE), width)


def bound(fields: tuple[str, ...], direction: str, key: Key) -> Q:
    """Rows strictly beyond ``key`` in ``direction``, as an index-friendly predicate."""
    first = fields[0]
    if direction == BEFORE:
        q = Q(**{f"{first}__lte" if len(fields) > 1 else f"{first}__lt": key[0]})
        if len(fields) > 1:
            q &= Q(**{f"{first}__lt": key[0]}) | Q(**{f"{fields[1]}__lt": key[1]})
        return q
    q = Q(**{f"{first}__gte" if len(fields) > 1 else f"{first}__gt": key[0]})
    if len(fields) > 1:
        q &= Q(**{f"{first}__gt": key[0]}) | Q(**{f"{fields[1]}__gt": key[1]})
    return q


class KeysetChangeList(ChangeList):
    """A changelist paged by key (``before``/``after``), never by offset, never counted.

    (``get_query_string``'s ``remove`` drops every parameter *starting* with a
    name, so the page number ``p``, never in ``params`` anyway, is not listed:
    it would drop any filter whose name starts with a ``p``.)
    """

    def get_filters_params(self, params: Any = None) -> dict[str, Any]:
        lookup_params = super().get_filters_params(params)
        lookup_params.pop(BEFORE, None)
        lookup_params.pop(AFTER, None)
        return lookup_params

    def get_results(self, request: HttpRequest) -> None:
        fields = cast("KeysetAdminMixin", self.model_admin).get_keyset_fields(request)
        direction, key = page_position(request, len(fields))
        qs: QuerySet = self.queryset
        if key is not None:
            qs = qs.filter(bound(fields, direction, key))
        order = fields if direction == AFTER else tuple(f"-{f}" for f in fields)
        qs = qs.order_by(*order)
        per_page = self.list_per_page
        rows = list(qs[: per_page + 1])
        more = len(rows) > per_page
        rows = rows[:per_page]
        if direction == AFTER:
            rows.reverse()
            newer, older = more, True
        else:
            newer, older = key is not None, more
        resume = getattr(request, "atlas_keyset_resume", None)
        older_url: str | None = None
        if resume is not None and not more:
            # The search stopped early: older matches may remain below where it stopped.
            older_url = self.get_query_string({BEFORE: format_key(resume)}, [AFTER])
        elif older and rows:
            older_url = self.get_query_string({BEFORE: self.key_of(rows[-1], fields)}, [AFTER])
        self.older_url = older_url
        self.newer_url = (
            self.get_query_string({AFTER: self.key_of(rows[0], fields)}, [BEFORE])
            if newer and rows
            else None
        )
        self.newest_url = self.get_query_string({}, [BEFORE, AFTER]) if key is not None else None
        self.result_list = rows
        self.result_count = len(rows)
        self.full_result_count = None
        self.show_full_result_count = False
        self.show_admin_actions = True
        self.can_show_all = False
        self.multi_page = False
        self.paginator = None

    @staticmethod
    def key_of(row: Any, fields: tuple[str, ...]) -> str:
        return format_key(tuple(getattr(row, f) for f in fields))


class KeysetAdminMixin(admin.ModelAdmin):
    """Use :class:`KeysetChangeList`; the key is :attr:`keyset_fields`, newest first.

    Column sorting is off (the key is the order), and so are facet counts.
    """

    keyset_fields: tuple[str, ...] = ("seq",)
    sortable_by = ()
    show_facets = admin.ShowFacets.NEVER

    def get_keyset_fields(self, request: HttpRequest) -> tuple[str, ...]:
        return self.keyset_fields

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return KeysetChangeList
