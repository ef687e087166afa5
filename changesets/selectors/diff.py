"""Diffs between two points of the log: one entity, or every entity of a namespace.

A point is a baseline changeset (the state right after it, as for as-of
reads), or "now" on a store (a branch as it reads today). Patches are RFC
6902, made by the ``jsonpatch`` library, which tells ``1``, ``1.0`` and
``true`` apart as Atlas does; applying one to ``before`` gives ``after``
(``tests/changesets/test_blame_diff.py`` checks it on seeded histories).

The namespace diff between two changesets is two as-of reads merge-joined by
key in one statement per batch (:data:`_DIFF_SQL`), and PostgreSQL compares
the two images, so an entity that did not change costs a key and a flag on
the wire, never its content. Against a branch's "now" it merges two sorted
streams (the as-of read and the branch's listing) the same way, in Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonpatch

from atlas.exceptions import BadRequest
from atlas.replicas import read_connection
from changesets import keyhash
from changesets.archive import boundary
from changesets.models import BASELINE, Changeset
from changesets.ops import canonical
from changesets.selectors import asof
from changesets.selectors.log import visible_changesets
from entities.store import EntityKey, EntityStore, StoredEntity, entity_filters, load_json

# Extra keys in the first batch, as for as-of pages, and the smallest later batch.
_SLACK = 32

# One batch of the walk over keys created at or before ``top`` (the later point), in
# key order. ``hi`` is each key's newest revision at or before ``top``; when it is at
# or before ``bottom`` too, the key is the same at both points and ``lo`` is not read
# (its seek is gated on that). Both seeks run on ``revision_key``
# (``changesets.keyhash``). Images come back only for keys whose images differ
# (as jsonb text: 1 and 1.0 differ, as everywhere in Atlas).
_DIFF_SQL = """
SELECT c.namespace, c.kind, c.slug, d.differs,
       CASE WHEN d.differs THEN hi.after END, CASE WHEN d.differs THEN lo.after END
FROM (
    SELECT DISTINCT namespace, kind, slug
    FROM {source} AS changesets_revision
    WHERE branch = '' AND op = 'create' AND seq <= %s AND {where}{live:changesets_revision}
    ORDER BY namespace, kind, slug
    LIMIT %s
) c
CROSS JOIN LATERAL (
    SELECT r.seq, r.after FROM {source} r
    WHERE {key} AND r.seq <= %s{live:r}
    ORDER BY r.seq DESC LIMIT 1
) hi
LEFT JOIN LATERAL (
    SELECT r.after FROM {source} r
    WHERE hi.seq > %s AND {key} AND r.seq <= %s{live:r}
    ORDER BY r.seq DESC LIMIT 1
) lo ON TRUE
CROSS JOIN LATERAL (
    SELECT hi.seq > %s AND hi.after::text IS DISTINCT FROM lo.after::text AS differs
) d
ORDER BY c.namespace, c.kind, c.slug
""".replace("{key}", keyhash.joined("r", "c", branch="''"))


def _diff_statement(where: str, bottom: int) -> str:
    """:data:`_DIFF_SQL` over the revisions reads after the archive cut see
    (``changesets.archive.boundary``); both points must lie after it."""
    cut = boundary.current()
    if cut is not None and bottom <= cut.seq:
        raise boundary.gone("That point of the log is archived.", cut=cut, seq=bottom)
    return boundary.sourced(_DIFF_SQL, cut).format(where=where)


def make_patch(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[dict[str, Any]]:
    """RFC 6902 operations that turn ``before`` into ``after`` (null: the entity is absent)."""
    if before is None or after is None:
        return [] if before is after else [{"op": "replace", "path": "", "value": after}]
    return list(jsonpatch.make_patch(before, after).patch)


@dataclass(frozen=True)
class EntityDiff:
    """One entity at two points; ``op`` says what happened between them."""

    key: EntityKey
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @property
    def op(self) -> str:
        if self.before is None:
            return "create"
        return "delete" if self.after is None else "update"

    @property
    def patch(self) -> list[dict[str, Any]]:
        return make_patch(self.before, self.after)


@dataclass(frozen=True)
class Listing:
    """What a namespace diff covers: the caller's readable namespaces and the filters."""

    namespaces: Sequence[str] | None
    namespace: str
    kind: str | None = None
    slug_prefix: str | None = None

    def where(self, after: EntityKey | None) -> tuple[str, list[Any]]:
        return entity_filters(
            "namespace",
            "kind",
            "slug",
            namespaces=self.namespaces,
            namespace=self.namespace,
            kind=self.kind,
            slug_prefix=self.slug_prefix,
            after=after,
        )


@dataclass(frozen=True)
class Points:
    """A diff's two points: baseline changesets; ``to`` None is "now" on a branch."""

    start: Changeset
    end: Changeset | None


def resolve_points(
    *, namespaces: Sequence[str] | None, branch: str, values: Mapping[str, Any]
) -> Points:
    """The changesets ``from``/``from_time`` and ``to``/``to_time`` name (``values``).

    1. Both points are baseline changesets the caller can see, resolved as
       as-of reads resolve them (404 unknown or invisible, 400 a branch's).
    2. ``to`` absent is now: on baseline, the newest baseline changeset the
       caller can see (what they read now, pinned so a paged diff holds
       still); on a branch, the branch as it reads now (``end`` None).
    3. Under a branch, ``to`` is refused (400): a branch reads baseline as it
       is now, so it has no past of its own to name.
    """
    if branch and ("to" in values or "to_time" in values):
        raise BadRequest(
            "Under a branch a diff runs from a baseline point to the branch now; drop"
            " to/to_time, or the branch header.",
            pointer=asof.BRANCH_POINTER,
        )
    start = asof.as_of_resolve(
        branch="",
        namespaces=namespaces,
        changeset_id=values.get("from"),
        at=values.get("from_time"),
        name="from",
    )
    if "to" in values or "to_time" in values:
        end = asof.as_of_resolve(
            branch="",
            namespaces=namespaces,
            changeset_id=values.get("to"),
            at=values.get("to_time"),
            name="to",
        )
        return Points(start, end)
    if branch:
        return Points(start, None)
    newest = visible_changesets(namespaces).filter(branch=BASELINE).order_by("-seq").first()
    return Points(start, newest or start)


def entity_diff(
    *, key: EntityKey, from_seq: int, to_seq: int | None, store: EntityStore
) -> EntityDiff:
    """``key`` right after ``from_seq`` and right after ``to_seq`` (None: now, on ``store``)."""
    before = asof.entity_as_of(seq=from_seq, key=key)
    after = asof.entity_as_of(seq=to_seq, key=key) if to_seq is not None else store.get(key)
    return EntityDiff(key, _content(before), _content(after))


def _content(entity: StoredEntity | None) -> dict[str, Any] | None:
    return entity.content if entity is not None else None


def namespace_diff(
    *, listing: Listing, from_seq: int, to_seq: int, after: EntityKey | None, limit: int
) -> list[EntityDiff]:
    """Up to ``limit`` entities whose content differs between two baseline points, in
    key order after ``after``: :data:`_DIFF_SQL` a batch of keys at a time until the
    page is full or the keys run out.

    The next batch is sized by what the page still needs at the share of differing
    keys seen so far (a quarter more, at least the slack, at most four times the last
    batch): a sparse diff grows fast, and a dense one does not read far past the page.
    Growing fourfold blindly, a page of 500 where one key in ten differs read to the
    end of a 10,000-key namespace, every page (bench/keys_blame_diff.py). Images are
    decoded only until the page is full.
    """
    top, bottom = max(from_seq, to_seq), min(from_seq, to_seq)
    out: list[EntityDiff] = []
    batch, seen = limit + _SLACK, 0
    while True:
        where, params = listing.where(after)
        with read_connection().cursor() as cursor:
            cursor.execute(
                _diff_statement(where, bottom), [top, *params, batch, top, bottom, bottom, bottom]
            )
            rows = cursor.fetchall()
        for ns, kind, slug, differs, hi, lo in rows:
            if differs:
                late, early = load_json(hi), load_json(lo)
                before, after_ = (early, late) if from_seq <= to_seq else (late, early)
                out.append(EntityDiff(EntityKey(ns, kind, slug), before, after_))
                if len(out) == limit:
                    return out
        if len(rows) < batch:
            return out
        seen += len(rows)
        after = EntityKey(rows[-1][0], rows[-1][1], rows[-1][2])
        wanted = math.ceil((limit - len(out)) * seen / max(len(out), 1) * 1.25)
        batch = min(batch * 4, max(wanted, _SLACK))


def namespace_diff_to_store(
    *, listing: Listing, from_seq: int, store: EntityStore, after: EntityKey | None, limit: int
) -> list[EntityDiff]:
    """Up to ``limit`` entities that differ between baseline right after ``from_seq``
    and ``store`` now (a branch), in key order after ``after``: the two sorted
    streams merge-joined by key, each read a batch at a time."""
    early = _stream(
        lambda pos, n: asof.entities_as_of(seq=from_seq, after=pos, limit=n, **_kw(listing)),
        after,
        limit,
    )
    late = _stream(lambda pos, n: store.list(after=pos, limit=n, **_kw(listing)), after, limit)
    out: list[EntityDiff] = []
    a, b = next(early, None), next(late, None)
    while len(out) < limit and (a is not None or b is not None):
        if a is not None and (b is None or a.key < b.key):  # gone by now
            out.append(EntityDiff(a.key, a.content, None))
            a = next(early, None)
        elif b is not None and (a is None or b.key < a.key):  # new since
            out.append(EntityDiff(b.key, None, b.content))
            b = next(late, None)
        elif a is not None and b is not None:  # on both sides
            if canonical(a.content) != canonical(b.content):
                out.append(EntityDiff(a.key, a.content, b.content))
            a, b = next(early, None), next(late, None)
    return out


def _kw(listing: Listing) -> dict[str, Any]:
    return {
        "namespaces": listing.namespaces,
        "namespace": listing.namespace,
        "kind": listing.kind,
        "slug_prefix": listing.slug_prefix,
    }


def _stream(fetch: Any, after: EntityKey | None, limit: int) -> Iterator[StoredEntity]:
    """Entities in key order after ``after``, fetched a growing batch at a time."""
    batch = limit + _SLACK
    while True:
        rows = fetch(after, batch)
        yield from rows
        if len(rows) < batch:
            return
        after = rows[-1].key
        batch *= 4
