"""Reads behind restore: a version's content, a scope's as-of state, the trash.

All three read revision rows only: history is complete (invariant 1), so the
content an entity had at any version or point, and whether its newest
revision is a delete, are facts of the log, never of the live table.

- :func:`version_content` — one key's content at a version (a seek on
  ``revision_key``; a key's history is short beside the log's).
- :func:`scope_as_of` — every entity of a scope as it stood right after a
  changeset, in **one** statement (the scope's keys off ``revision_creates``,
  then each key's newest revision at or before the point, a seek on
  ``revision_key``): restore diffs it against the current state in memory, so
  its cost follows the scope's keys, never a query per entity.
- :func:`deleted_entities` — a keyset page of the baseline keys whose newest
  revision is a delete, walked on the partial index ``revision_deletes``
  (migration 0020) in batches limited on the walk: a page costs about its
  own size, however many live entities or older deletes share the scope.

After an archive cut the first two read the state at the cut beside the
revisions after it (``changesets.archive.boundary.revision_source``), so they
answer as before for any point after it; a version only the archive holds is a
410. The trash lists deletes after the cut (an older delete is archived).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast
from uuid import UUID

from django.db import connection

from atlas.db import prepared_cursor
from changesets import keyhash
from changesets.archive import boundary
from changesets.archive.models import ArchiveBase
from changesets.models import BASELINE, Revision
from changesets.selectors.rows import changeset_briefs
from entities.store import EntityKey, entity_filters, load_json


@dataclass(frozen=True)
class VersionImage:
    """What a key held at one version, and where in the log that version was written."""

    content: dict[str, Any]
    version: int
    branch: str
    seq: int


def version_content(*, key: EntityKey, version: int, branch: str = BASELINE) -> VersionImage | None:
    """The content ``key`` had at ``version`` as seen from ``branch`` (None: no such version).

    A version is written by exactly one revision per line of history (versions
    never restart: a re-created key continues after its last one). On a branch
    the branch's own revision wins over baseline's, as its reads do; then the
    newest baseline one.
    """
    branches = [branch] if branch == BASELINE else [branch, BASELINE]
    for on in branches:
        found = (
            Revision.objects.of_entity(on, key.namespace, key.kind, key.slug)
            .filter(after_version=version)
            .order_by("-seq")
            .values_list("after", "seq")
            .first()
        )
        if found is not None:
            # A revision with an after_version has an after image (revision_images_match_op).
            after, seq = found
            return VersionImage(
                content=cast(dict[str, Any], after), version=version, branch=on, seq=seq
            )
    return _archived_version(key, version)


def _archived_version(key: EntityKey, version: int) -> VersionImage | None:
    """After a cut: the version from the state at the cut, a 410 when it is older than
    any row still held (only the archive has it), else None (no such version: 404)."""
    cut = boundary.current()
    if cut is None:
        return None
    state = ArchiveBase.objects.filter(
        namespace=key.namespace, kind=key.kind, slug=key.slug, valid_from__lte=cut.seq
    ).exclude(valid_to__lte=cut.seq)
    held = state.filter(after_version=version).values_list("after", "seq").first()
    if held is not None:
        return VersionImage(
            content=cast(dict[str, Any], held[0]), version=version, branch="", seq=held[1]
        )
    # Versions only rise: one below the first written after the cut (or, with none
    # written since, up to the last one at the cut) was written before the cut.
    hot = (
        Revision.objects.of_entity(BASELINE, key.namespace, key.kind, key.slug)
        .filter(seq__gt=cut.seq)
        .exclude(after_version=None)
    )
    first_after = hot.order_by("seq").values_list("after_version", flat=True).first()
    versions = [v for v in state.values_list("after_version", flat=True) if v is not None]
    upper = first_after if first_after is not None else (max(versions) + 1 if versions else None)
    if upper is None or version < upper:
        raise boundary.gone("That version is archived.", cut=cut, pointer="/version")
    return None


# Per key of a scope, its newest baseline revision at or before the point: the keys
# created by then, off ``revision_creates`` in key order, then a seek per key on
# ``revision_key``. Parameters: the point, the scope's, the point again.
_SCOPE_AT = (
    """
    SELECT c.namespace, c.kind, c.slug, h.after, h.after_version
    FROM (
        SELECT DISTINCT ON (namespace, kind, slug) namespace, kind, slug
        FROM {source} AS changesets_revision
        WHERE branch = '' AND op = 'create' AND seq <= %s AND {where}{live:changesets_revision}
        ORDER BY namespace, kind, slug, seq DESC
    ) c
    CROSS JOIN LATERAL (
        SELECT r.after, r.after_version FROM {source} r
        WHERE """
    + keyhash.joined("r", "c", branch="''")
    + """ AND r.seq <= %s{live:r}
        ORDER BY r.seq DESC LIMIT 1
    ) h
"""
)
# One statement for a scope at a point: keys deleted at the point are dropped, so
# the LIMIT counts entities that existed then.
_SCOPE_AS_OF = (
    "SELECT * FROM ("
    + _SCOPE_AT
    + """) s
WHERE after IS NOT NULL
ORDER BY namespace, kind, slug
LIMIT %s
"""
)


def _sourced(sql: str, seq: int) -> str:
    """``sql`` over the revisions a read at ``seq`` sees (410 at or before the cut)."""
    cut = boundary.current()
    if cut is not None and seq <= cut.seq:
        raise boundary.gone("That point of the log is archived.", cut=cut, seq=seq)
    return boundary.sourced(sql, cut)


@dataclass(frozen=True)
class ScopeImage:
    key: EntityKey
    content: dict[str, Any]
    version: int


def scope_as_of(
    *,
    seq: int,
    namespace: str,
    kind: str | None = None,
    slug_prefix: str | None = None,
    limit: int,
) -> list[ScopeImage]:
    """Every baseline entity of the scope as it stood right after changeset ``seq``,
    in key order, at most ``limit`` (one statement; see the module docstring)."""
    where, params = entity_filters(
        "namespace",
        "kind",
        "slug",
        namespaces=None,
        namespace=namespace,
        kind=kind,
        slug_prefix=slug_prefix,
        after=None,
    )
    # Raw SQL buys DISTINCT ON over a partial index and a lateral seek per key, which
    # the ORM cannot spell.
    sql = _sourced(_SCOPE_AS_OF, seq).format(where=where)
    with connection.cursor() as cursor:
        cursor.execute(sql, [seq, *params, seq, limit])
        return [
            ScopeImage(EntityKey(ns, k, s), load_json(after), version)
            for ns, k, s, after, version in cursor.fetchall()
        ]


@dataclass(frozen=True)
class ScopeChange:
    """One key of a scope whose content differs between a point and now: what it
    held then (``target``, None = absent) and its version now (None = absent)."""

    key: EntityKey
    target: dict[str, Any] | None
    version_now: int | None


# The baseline fast path of a scope restore, in one statement: the scope at the point
# (as in ``_SCOPE_AS_OF``) full-joined with the live rows of the scope, keeping the
# keys whose JSON text differs (jsonb text is canonical, so equal text is equal
# content; the write service still compares what it is given). Only those rows come
# back, with their count over all of them, so a scope of any size costs a seek per key
# of it plus its live rows, and memory follows the changes.
_SCOPE_CHANGES = (
    "WITH t AS ("
    + _SCOPE_AT.replace("{where}", "{where_t}")
    + """), n AS (
    SELECT namespace_id, kind, slug, content, version FROM entities_entity WHERE {where_n}
)
SELECT COALESCE(t.namespace, n.namespace_id), COALESCE(t.kind, n.kind),
       COALESCE(t.slug, n.slug), t.after, n.version, count(*) OVER ()
FROM t FULL JOIN n
  ON n.namespace_id = t.namespace AND n.kind = t.kind AND n.slug = t.slug
WHERE t.after::text IS DISTINCT FROM n.content::text
ORDER BY 1, 2, 3
LIMIT %s
"""
)


def scope_changes_baseline(
    *,
    seq: int,
    namespace: str,
    kind: str | None = None,
    slug_prefix: str | None = None,
    limit: int,
) -> tuple[list[ScopeChange], int]:
    """The baseline keys of a scope whose content differs between changeset ``seq``
    and now, in key order, at most ``limit`` of them, and how many there are."""
    filters: dict[str, Any] = {
        "namespaces": None,
        "namespace": namespace,
        "kind": kind,
        "slug_prefix": slug_prefix,
        "after": None,
    }
    where_t, params_t = entity_filters("namespace", "kind", "slug", **filters)
    where_n, params_n = entity_filters("namespace_id", "kind", "slug", **filters)
    sql = _sourced(_SCOPE_CHANGES, seq).format(where_t=where_t, where_n=where_n)
    # Raw SQL buys DISTINCT ON and the full join with a window count in one statement.
    with connection.cursor() as cursor:
        cursor.execute(sql, [seq, *params_t, seq, *params_n, limit])
        rows = cursor.fetchall()
    changes = [
        ScopeChange(EntityKey(ns, k, s), load_json(after) if after is not None else None, version)
        for ns, k, s, after, version, _ in rows
    ]
    return changes, rows[0][5] if rows else 0


@dataclass(frozen=True)
class DeletedEntity:
    """A trash entry: a baseline key whose newest revision is a delete."""

    key: EntityKey
    content: dict[str, Any]  # what the delete removed (its revision's ``before``)
    last_version: int  # the version the delete removed
    changeset_id: UUID
    author: str
    at: datetime
    seq: int


# One batch of the trash walk: per key (in key order, off the partial index
# ``revision_deletes``), its newest delete, ``batch`` keys at most, each with
# whether the key lives again now (then that delete is not its newest revision:
# history is complete). The LIMIT sits on the walk itself, so a batch costs its
# own size however many keys follow; the caller drops the live ones and walks on.
# A delete stores its whole before image in ``undo`` (``changesets.undo``).
# The deletes' authors come in a second statement, by the batch's seqs
# (``rows.changeset_briefs``): joined, the changeset table was planned over every
# partition for each revision partition, 2 ms of planning at ten million changesets
# for a page that ran in 0.04.
_DELETED = """
SELECT d.namespace, d.kind, d.slug, d.undo, d.before_version, d.changeset_id, d.at, d.seq,
       EXISTS (
           SELECT 1 FROM entities_entity e
           WHERE e.namespace_id = d.namespace AND e.kind = d.kind AND e.slug = d.slug
       )
FROM (
    SELECT DISTINCT ON (namespace, kind, slug)
           namespace, kind, slug, undo, before_version, changeset_id, at, seq
    FROM changesets_revision
    WHERE branch = '' AND op = 'delete' {after_cut}AND {where}
    ORDER BY namespace, kind, slug, seq DESC
    LIMIT %s
) d
ORDER BY d.namespace, d.kind, d.slug
"""
# Extra keys per batch, so a few re-created keys rarely cost a second round trip.
_SLACK = 32


def deleted_entities(
    *,
    namespaces: Sequence[str] | None,
    namespace: str | None = None,
    kind: str | None = None,
    slug_prefix: str | None = None,
    after: EntityKey | None = None,
    limit: int = 50,
) -> list[DeletedEntity]:
    """One keyset page of the trash: baseline keys whose newest revision is a delete.

    ``namespaces`` is the caller's readable set (``None`` = all): keys in other
    namespaces are never read (invariant 8). Walked in batches of the page
    size (plus slack), each next batch four times larger, like the as-of walk:
    a long run of deleted-then-re-created keys costs a few round trips.
    """
    out: list[DeletedEntity] = []
    batch = limit + _SLACK
    while True:
        where, params = entity_filters(
            "namespace",
            "kind",
            "slug",
            namespaces=namespaces,
            namespace=namespace,
            kind=kind,
            slug_prefix=slug_prefix,
            after=after,
        )
        walked = _deleted(where, [*params, batch])
        out.extend(entry for entry, alive in walked if not alive)
        if len(out) >= limit or len(walked) < batch:
            return out[:limit]
        after = walked[-1][0].key
        batch *= 4


def deleted_entity(*, key: EntityKey) -> DeletedEntity | None:
    """``key``'s trash entry: its newest delete, if that is its newest revision (else None)."""
    found = _deleted(
        "namespace = %s AND kind = %s AND slug = %s", [key.namespace, key.kind, key.slug, 1]
    )
    return found[0][0] if found and not found[0][1] else None


def _deleted(where: str, params: Sequence[Any]) -> list[tuple[DeletedEntity, bool]]:
    """One batch of the walk: (entry, lives again now) per key, in key order.

    Prepared (``atlas.db.prepared_cursor``): the walk names every partition of the
    revision table, and planned for each request it cost 0.7 ms at 100,000
    changesets and 2.4 at ten million (13 partitions) for a walk that ran in 0.1-0.2;
    the generic plan is the same merge of the partitions' ``revision_deletes``."""
    # Raw SQL buys DISTINCT ON over a partial index, limited on the walk, in one statement.
    floor = boundary.floor()
    after_cut = f"AND seq > {int(floor)} " if floor else ""
    with prepared_cursor() as cursor:
        cursor.execute(_DELETED.format(where=where, after_cut=after_cut), params)
        rows = cursor.fetchall()
    briefs = changeset_briefs((row[7] for row in rows), using=connection)
    # On the connection the deletes came from, as the join read them. A delete whose
    # changeset went between the two statements (an archive cut) is left out, as the
    # join left it out.
    return [
        (
            DeletedEntity(
                key=EntityKey(ns, k, s),
                content=load_json(before),
                last_version=version,
                changeset_id=cs,
                author=briefs[seq][0],
                at=at,
                seq=seq,
            ),
            alive,
        )
        for ns, k, s, before, version, cs, at, seq, alive in rows
        if seq in briefs
    ]
