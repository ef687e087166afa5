"""The overlay against baseline: what a merge would land, and the branch diff.

Every read here compares the branch's overlay rows with baseline's current
rows in SQL, so its cost grows with the overlay, not with the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection

from branches.models import Branch
from changesets.selectors.feed import BASELINE_AFTER_COUNT
from entities.store import EntityKey, StoredEntity, load_json


@dataclass(frozen=True)
class OverlayChange:
    """One key where the branch's state differs from baseline's current state.

    ``op`` is what the branch did relative to the baseline it started from:
    ``create`` (baseline had no such entity when the branch first wrote it),
    ``update`` or ``delete``. ``conflict`` is true when baseline has moved
    since (its version is no longer ``base_version``) and does not already
    hold what the branch holds; merge refuses such keys.
    """

    key: EntityKey
    op: str
    deleted: bool
    base_version: int | None
    baseline_version: int | None
    conflict: bool
    changeset_id: UUID  # the branch changeset that last wrote the key
    content: dict[str, Any] | None = None  # the branch's content (merge plans only)


def _op(deleted: bool, base_version: int | None) -> str:
    if deleted:
        return "delete"
    return "create" if base_version is None else "update"


def _change(row: Sequence[Any], *, with_content: bool) -> OverlayChange:
    ns, kind, slug, deleted, base_version, baseline_version, changeset_id = row[:7]
    return OverlayChange(
        key=EntityKey(ns, kind, slug),
        op=_op(deleted, base_version),
        deleted=deleted,
        base_version=base_version,
        baseline_version=baseline_version,
        conflict=base_version != baseline_version,
        changeset_id=changeset_id,
        content=load_json(row[7]) if with_content and not deleted else None,
    )


# "The branch's state equals baseline's current state": both absent, or the
# same jsonb. jsonb's text form is canonical for a stored value (sorted keys,
# numbers as written), so text equality is exactly the write service's
# byte-identical comparison, without shipping content to Python.
_SAME = (
    "CASE WHEN o.deleted THEN {b}.slug IS NULL"
    " ELSE {b}.slug IS NOT NULL AND {b}.content::text = o.content::text END"
)


def _overlay_where(
    branch: Branch, namespaces: Sequence[str] | None, after: EntityKey | None = None
) -> tuple[str, list[Any]]:
    """The WHERE of the overlay-vs-baseline queries (overlay ``o``, baseline ``e``)."""
    where = f"o.branch_id = %s AND NOT ({_SAME.format(b='e')})"
    params: list[Any] = [branch.pk]
    if namespaces is not None:
        where += " AND o.namespace_id = ANY(%s::text[])"
        params.append(list(namespaces))
    if after is not None:
        where += " AND (o.namespace_id, o.kind, o.slug) > (%s, %s, %s)"
        params += [after.namespace, after.kind, after.slug]
    return where, params


_OVERLAY_JOIN = (
    " FROM branches_branchentity o"
    " LEFT JOIN entities_entity e ON e.namespace_id = o.namespace_id"
    "  AND e.kind = o.kind AND e.slug = o.slug"
)


def overlay_changes(
    *,
    branch: Branch,
    namespaces: Sequence[str] | None = None,
    with_content: bool = False,
    after: EntityKey | None = None,
    limit: int | None = None,
) -> list[OverlayChange]:
    """The branch's keys whose state differs from baseline's, in key order; one query.

    Keys the branch wrote but that now equal baseline (changed back, or baseline
    reached the same content independently) are left out: the result is
    exactly what a merge would land, plus the conflicts that would stop it.
    Cost grows with the branch's overlay, not with the store. ``after`` and
    ``limit`` cut one keyset page (the overlay's unique index is in key order).
    """
    where, params = _overlay_where(branch, namespaces, after)
    sql = (
        "SELECT o.namespace_id, o.kind, o.slug, o.deleted, o.base_version, e.version,"
        f" o.changeset_id{', o.content' if with_content else ''}"
        f"{_OVERLAY_JOIN} WHERE {where} ORDER BY o.namespace_id, o.kind, o.slug"
    )
    if limit is not None:
        sql += " LIMIT %s"
        params.append(limit)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [_change(row, with_content=with_content) for row in cursor.fetchall()]


def overlay_change_counts(*, branch: Branch) -> dict[str, int]:
    """How many keys a merge of ``branch`` would land (or find in conflict), per namespace.

    The same rows as :func:`overlay_changes`, counted without reading any
    content: a merge checks its permissions and op limit on these numbers
    before it loads the plan.
    """
    where, params = _overlay_where(branch, None)
    sql = f"SELECT o.namespace_id, count(*){_OVERLAY_JOIN} WHERE {where} GROUP BY o.namespace_id"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {ns: n for ns, n in cursor.fetchall()}


def overlay_changes_locked(
    *, branch: Branch
) -> tuple[list[OverlayChange], dict[EntityKey, StoredEntity]]:
    """Like :func:`overlay_changes`, after locking baseline's rows of every overlay key.

    For the merge, inside its write transaction (the branch row already
    locked): baseline rows are locked ``FOR UPDATE`` in key order, and the
    comparison uses the locked (latest) row versions, so what is judged is
    what the merge writes over. Returns the changes and, for each changed key
    that exists on baseline, its locked baseline entity.
    """
    sql = (
        "WITH b AS ("
        "  SELECT e.namespace_id, e.kind, e.slug, e.content, e.version, e.created_at,"
        "   e.updated_at, e.changeset_id"
        "  FROM entities_entity e JOIN branches_branchentity o2 ON o2.branch_id = %s"
        "   AND o2.namespace_id = e.namespace_id AND o2.kind = e.kind AND o2.slug = e.slug"
        "  ORDER BY e.namespace_id, e.kind, e.slug FOR UPDATE OF e)"
        " SELECT o.namespace_id, o.kind, o.slug, o.deleted, o.base_version, b.version,"
        "  o.changeset_id, b.content, b.created_at, b.updated_at, b.changeset_id"
        " FROM branches_branchentity o LEFT JOIN b ON b.namespace_id = o.namespace_id"
        "  AND b.kind = o.kind AND b.slug = o.slug"
        f" WHERE o.branch_id = %s AND NOT ({_SAME.format(b='b')})"
        " ORDER BY o.namespace_id, o.kind, o.slug"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [branch.pk, branch.pk])
        rows = cursor.fetchall()
    changes: list[OverlayChange] = []
    baseline: dict[EntityKey, StoredEntity] = {}
    for row in rows:
        change = _change(row, with_content=False)
        changes.append(change)
        if row[5] is not None:
            baseline[change.key] = StoredEntity(
                key=change.key,
                content=load_json(row[7]),
                version=row[5],
                created_at=row[8],
                updated_at=row[9],
                changeset_id=row[10],
            )
    return changes, baseline


@dataclass(frozen=True)
class Diff:
    behind: int
    ahead: int
    changes: list[OverlayChange]


def branch_diff(
    *,
    branch: Branch,
    namespaces: Sequence[str] | None,
    after: EntityKey | None = None,
    limit: int | None = None,
) -> Diff:
    """How far baseline moved since the base point, the branch's changesets, and its changes.

    The base point is the fork until a sync moves it (``Branch.base_seq``), so
    ``behind`` is 0 right after a sync.

    Two queries: the two counts, and :func:`overlay_changes`. ``ahead`` is a
    range of ``changeset_branch_seq`` (branch changesets only); ``behind``, for
    a caller who reads everything, counts index entries only
    (:data:`~changesets.selectors.feed.BASELINE_AFTER_COUNT`), else reads the
    changesets after the base point for their namespaces. Counts and changes
    are limited to changesets and keys in ``namespaces`` (the caller's readable
    set; ``None`` = all). ``changes`` is one keyset page: the keys after
    ``after``, at most ``limit`` of them (``None``: all); the counts are always
    whole.
    """
    ns_clause, ns_params = "", []
    if namespaces is None:
        behind_sql = BASELINE_AFTER_COUNT
        behind_params: list[Any] = [branch.base_seq, branch.base_seq]
    else:
        ns_clause = " AND c.namespaces && %s::varchar[]"
        ns_params = [list(namespaces)]
        behind_sql = (
            "(SELECT count(*) FROM changesets_changeset c WHERE c.branch = '' AND c.seq > %s"
            f"{ns_clause})"
        )
        behind_params = [branch.base_seq, *ns_params]
    sql = (
        f"SELECT {behind_sql},"
        f" (SELECT count(*) FROM changesets_changeset c WHERE c.branch = %s{ns_clause})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*behind_params, branch.name, *ns_params])
        behind, ahead = cursor.fetchone()
    changes = overlay_changes(branch=branch, namespaces=namespaces, after=after, limit=limit)
    return Diff(behind=behind, ahead=ahead, changes=changes)
