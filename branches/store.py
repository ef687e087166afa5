"""The branch overlay store, and the branch-row helpers every branch write shares.

:class:`BranchStore` implements ``entities.store.EntityStore`` over a branch:
reads see the branch's overlay rows over baseline *as it is now* (a tombstone
hides the baseline row), writes land in the overlay only. The write service
(``changesets.services.apply.changeset_apply``) drives it exactly like the baseline
store, which is how branch writes become changesets with ``branch`` set.

:class:`branches.merge.MergeStore` is the baseline store plus a merge's
bookkeeping, built on the helpers here.

Only the write service may call the mutating methods (DESIGN invariant 1).
A store keeps per-transaction state between ``lock`` and ``apply``: make one
per write (they are cheap), never share one between threads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple
from uuid import UUID

from django.db import connection

from atlas.exceptions import PermissionDenied
from branches.exceptions import BranchClosed
from branches.models import Branch, BranchStatus
from branches.selectors import may_write
from entities import writer
from entities.store import (
    EntityKey,
    EntityWrite,
    Locked,
    StoredEntity,
    WriteSql,
    contents_json,
    counted,
    entity_filters,
    guard_allows,
    namespaces_of,
    row_to_entity,
)

if TYPE_CHECKING:
    from entities.access import WriteGuard

_VIEW_COLUMNS = "namespace_id, kind, slug, content, version, created_at, updated_at, changeset_id"


def _keys_json(keys: Sequence[EntityKey], *extra: Sequence[Any]) -> str:
    """``[[namespace, kind, slug, *extra], …]`` as one JSON document, the write
    path's one way of passing many keys (see ``entities.store.json_array``)."""
    return json.dumps(
        [[k.namespace, k.kind, k.slug, *more] for k, *more in zip(keys, *extra, strict=True)]
    )


class LockedBranch(NamedTuple):
    """The branch row as locked by :func:`lock_branch_row`."""

    id: int
    name: str
    status: str
    namespaces: list[str]
    created_by_id: int | None


def lock_branch_row(branch_id: int) -> LockedBranch:
    """``SELECT … FOR UPDATE`` the branch row.

    Every branch write, the merge, the abandon and membership changes take
    this lock first, so they queue behind each other: a write can never land
    on a branch that a concurrent merge or abandon has just closed, nor by a
    member whose removal committed first.

    Anything else judged under this lock (membership) must be read by a
    *later* statement: under READ COMMITTED a statement that waited for the
    lock sees the locked row's newest version, but every other table as of
    its own start, i.e. before the transaction it waited for committed.
    """
    row = (
        Branch.objects.select_for_update()
        .filter(pk=branch_id)
        .values_list("id", "name", "status", "namespaces", "created_by_id")
        .first()
    )
    if row is None:  # pragma: no cover - branch rows are never deleted
        raise BranchClosed("The branch no longer exists.")
    return LockedBranch(row[0], row[1], row[2], list(row[3]), row[4])


MSG_WRITE_DENIED = (
    "Writing branch {name!r} needs its creator, one of its members, or the maintainer role"
    " in every namespace it touches."
)


def require_writer(user: Any, locked: LockedBranch, namespaces: Iterable[str] = ()) -> None:
    """403 unless ``user`` may write the locked branch (:func:`branches.selectors.may_write`).

    ``namespaces``: those about to be written, which the branch touches from then on.
    Call it after :func:`lock_branch_row`: membership is read by a statement of its own.
    """
    if not may_write(
        user,
        branch_id=locked.id,
        created_by_id=locked.created_by_id,
        namespaces={*locked.namespaces, *namespaces},
    ):
        raise PermissionDenied(MSG_WRITE_DENIED.format(name=locked.name))


def require_open(name: str, status: str) -> None:
    if status != BranchStatus.OPEN:
        raise BranchClosed(f"Branch {name!r} is {status}; it takes no more changes.")


# Raw SQL buys one statement for the overlay rows and baseline's share-locked rows.
# The keys are ``counted`` so the planner probes the entity index per key.
_LOCK_VIEW = (
    "WITH k AS (SELECT j.v->>0 AS ns, j.v->>1 AS kind, j.v->>2 AS slug"
    "  FROM {keys} j),"
    " b AS (SELECT e.namespace_id, e.kind, e.slug, e.content, e.version, e.created_at,"
    "  e.updated_at, e.changeset_id FROM entities_entity e"
    "  JOIN k ON e.namespace_id = k.ns AND e.kind = k.kind AND e.slug = k.slug"
    "  ORDER BY e.namespace_id, e.kind, e.slug FOR SHARE OF e)"
    " SELECT k.ns, k.kind, k.slug, o.id IS NOT NULL, o.deleted, o.content, o.version,"
    "  o.created_at, o.updated_at, o.changeset_id,"
    "  b.content, b.version, b.created_at, b.updated_at, b.changeset_id"
    " FROM k LEFT JOIN branches_branchentity o ON o.branch_id = %s"
    "  AND o.namespace_id = k.ns AND o.kind = k.kind AND o.slug = k.slug"
    " LEFT JOIN b ON b.namespace_id = k.ns AND b.kind = k.kind AND b.slug = k.slug"
)


@dataclass(frozen=True)
class _Seen:
    """What ``lock`` saw of a key that has no overlay row yet."""

    base_version: int | None  # baseline's version, None when absent
    base_created_at: datetime | None


class BranchStore:
    """A branch's overlay over baseline (``entities.store.EntityStore``).

    ``writer`` is the user on whose behalf the store writes: :meth:`lock`
    refuses (403) unless they may write the branch (its creator, a member, a
    superuser, or a maintainer of every namespace it touches). Every API path
    makes its store with ``atlas.api.branch.store_for``, which passes the
    request's user. ``None`` (read-only use, and code that has already decided)
    skips that rule; the namespace roles are checked by the write service
    either way.
    """

    def __init__(self, branch: Branch, *, writer: Any = None) -> None:
        self.branch = branch.name
        self.branch_id = branch.pk
        self.writer = writer
        self._seen: dict[EntityKey, _Seen] | None = None
        self._namespaces: set[str] = set(branch.namespaces)

    # --- reads: one statement each ------------------------------------------

    def get(self, key: EntityKey) -> StoredEntity | None:
        # Raw SQL buys one statement for overlay-or-baseline (tests/branches pin one per read).
        sql = (
            f"SELECT {_VIEW_COLUMNS}, deleted FROM branches_branchentity"
            " WHERE branch_id = %s AND namespace_id = %s AND kind = %s AND slug = %s"
            " UNION ALL"
            f" SELECT {_VIEW_COLUMNS}, FALSE FROM entities_entity e"
            " WHERE e.namespace_id = %s AND e.kind = %s AND e.slug = %s AND NOT EXISTS ("
            "  SELECT 1 FROM branches_branchentity o WHERE o.branch_id = %s"
            "  AND o.namespace_id = e.namespace_id AND o.kind = e.kind AND o.slug = e.slug)"
        )
        k = [key.namespace, key.kind, key.slug]
        with connection.cursor() as cursor:
            cursor.execute(sql, [self.branch_id, *k, *k, self.branch_id])
            row = cursor.fetchone()
        if row is None or row[8]:  # absent, or a tombstone
            return None
        return row_to_entity(row)

    def list(
        self,
        *,
        namespaces: Sequence[str] | None,
        namespace: str | None = None,
        kind: str | None = None,
        slug_prefix: str | None = None,
        after: EntityKey | None = None,
        limit: int = 50,
    ) -> list[StoredEntity]:
        """One keyset page of the branch's view, in (namespace, kind, slug) order.

        Two index-ordered halves, each cut at ``limit``, merged: the branch's
        live overlay rows, and baseline rows the overlay does not cover (an
        anti-join on the overlay's unique index, so tombstones hide baseline).
        """
        filters: dict[str, Any] = {
            "namespaces": namespaces,
            "namespace": namespace,
            "kind": kind,
            "slug_prefix": slug_prefix,
            "after": after,
        }
        o_where, o_params = entity_filters("o.namespace_id", "o.kind", "o.slug", **filters)
        e_where, e_params = entity_filters("e.namespace_id", "e.kind", "e.slug", **filters)
        # Raw SQL buys two index-ordered, LIMITed halves and the keyset's row-value comparison.
        sql = (
            f"SELECT {_VIEW_COLUMNS} FROM ("
            f" (SELECT {_VIEW_COLUMNS} FROM branches_branchentity o"
            f"  WHERE o.branch_id = %s AND NOT o.deleted AND {o_where}"
            "  ORDER BY o.namespace_id, o.kind, o.slug LIMIT %s)"
            " UNION ALL"
            f" (SELECT {_VIEW_COLUMNS} FROM entities_entity e"
            f"  WHERE {e_where} AND NOT EXISTS ("
            "   SELECT 1 FROM branches_branchentity x WHERE x.branch_id = %s"
            "   AND x.namespace_id = e.namespace_id AND x.kind = e.kind AND x.slug = e.slug)"
            "  ORDER BY e.namespace_id, e.kind, e.slug LIMIT %s)"
            ") v ORDER BY namespace_id, kind, slug LIMIT %s"
        )
        params = [self.branch_id, *o_params, limit, *e_params, self.branch_id, limit, limit]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [row_to_entity(row) for row in cursor.fetchall()]

    # --- writes (the write service only) ---------------------------------------

    def lock(self, keys: Iterable[EntityKey], *, guard: WriteGuard | None = None) -> Locked:
        """Lock the branch row, then baseline's rows of ``keys``; return the branch's view.

        0. The keys' namespaces (existence, ``protected``). If ``guard`` refuses
           any, nothing is locked: the write service refuses the write.
        1. The branch row, ``FOR UPDATE``: writes to one branch queue behind
           each other and behind a merge or abandon; a closed branch is 409;
           a ``writer`` who may not write the branch is 403 (decided under
           this lock, so a membership removed before it counts).
        2. Baseline rows of the keys, ``FOR SHARE`` in key order, read together
           with the overlay rows in one statement. Share locks keep the
           baseline a write is judged against stable until it commits without
           making two branches writing the same key wait for each other.
           Overlay rows need no row lock: only holders of the branch lock write them.

        Remembers, for keys the branch has not written yet, the baseline
        version seen here: :meth:`write_sql` records it as the key's ``base_version``.
        """
        keys = sorted(set(keys))
        existing = namespaces_of(k.namespace for k in keys) if keys else {}
        if not guard_allows(guard, existing):
            return Locked({}, existing)
        row = lock_branch_row(self.branch_id)
        require_open(row.name, row.status)
        if self.writer is not None:
            require_writer(self.writer, row, {k.namespace for k in keys})
        self._namespaces = set(row.namespaces)
        self._seen = {}
        if not keys:
            return Locked({}, existing)
        with connection.cursor() as cursor:
            keyset = counted("jsonb_array_elements(%s::jsonb) AS j(v)", len(keys))
            cursor.execute(_LOCK_VIEW.format(keys=keyset), [_keys_json(keys), self.branch_id])
            rows = cursor.fetchall()
        view: dict[EntityKey, StoredEntity] = {}
        for row in rows:
            key = EntityKey(row[0], row[1], row[2])
            has_overlay, deleted = row[3], row[4]
            if has_overlay:
                if not deleted:
                    view[key] = row_to_entity((*row[:3], *row[5:10]))
                continue
            base_version = row[11]
            self._seen[key] = _Seen(base_version, row[12])
            if base_version is not None:
                view[key] = row_to_entity((*row[:3], *row[10:15]))
        return Locked(view, existing)

    def write_sql(
        self,
        *,
        changeset_id: UUID,
        now: datetime,
        creates: Sequence[EntityWrite],
        updates: Sequence[EntityWrite],
        deletes: Sequence[EntityKey],
    ) -> WriteSql:
        """The changeset's net effect on the overlay, as CTEs for the log statement.

        Creates and updates are one upsert (content), deletes one upsert of
        tombstones; a key's first write on the branch records ``base_version``
        from what :meth:`lock` saw. Upserts cannot lose a race (the branch
        lock serializes this branch's writers), so ``creates`` is 0. A newly
        touched namespace is added to the branch's set (which decides who can
        see the branch) here, before the log statement.
        """
        if self._seen is None:
            raise RuntimeError("BranchStore.write_sql() without lock() in the same transaction")
        seen = self._seen
        writes = [*creates, *updates]
        touched = {k.namespace for k in deletes} | {w.key.namespace for w in writes}
        if not touched <= self._namespaces:
            self._namespaces |= touched
            Branch.objects.filter(pk=self.branch_id).update(namespaces=sorted(self._namespaces))

        def base(key: EntityKey) -> int | None:
            first = seen.get(key)
            return first.base_version if first else None

        def born(key: EntityKey, updated: bool) -> str:
            # An entity first written here keeps baseline's created_at when it
            # existed there; a create (or re-create) is born now.
            first = seen.get(key)
            at = first.base_created_at if first and updated else None
            return (at or now).isoformat()

        # Raw SQL buys the round trip: these CTEs ride the log statement.
        ctes: list[str] = []
        counts: list[str] = []
        params: dict[str, Any] = {"e_branch": self.branch_id, "e_now": now, "e_cs": changeset_id}
        if writes:
            ctes.append(_UPSERT_LIVE)
            keys = [w.key for w in writes]
            params["ew_keys"] = _keys_json(
                keys,
                [w.version for w in writes],
                [base(k) for k in keys],
                [born(k, i >= len(creates)) for i, k in enumerate(keys)],
            )
            params["ew_content"] = contents_json(writes)
            counts.append("(SELECT count(*) FROM ew)")
        if deletes:
            ctes.append(_UPSERT_TOMBSTONES)
            params["et_keys"] = _keys_json(deletes, [base(k) for k in deletes])
            counts.append("(SELECT count(*) FROM et)")
        if not ctes:
            return WriteSql("", params, "0", "0", 0)
        # The marker first, so that both upserts may join it (entities.writer).
        ctes.insert(0, writer.MARK_CTE)
        return WriteSql(", ".join(ctes), params, "0", writer.done_sql(" + ".join(counts)), 0)


_UPSERT_LIVE = (
    "ew AS (INSERT INTO branches_branchentity (branch_id, namespace_id, kind, slug,"
    " content, deleted, version, base_version, created_at, updated_at, changeset_id)"
    " SELECT %(e_branch)s::bigint, k.key->>0, k.key->>1, k.key->>2, k.content, FALSE,"
    " (k.key->>3)::int, (k.key->>4)::int, (k.key->>5)::timestamptz,"
    " %(e_now)s::timestamptz, %(e_cs)s::uuid"
    f" FROM {writer.MARK_JOIN}, ROWS FROM (jsonb_array_elements(%(ew_keys)s::jsonb),"
    " jsonb_array_elements(%(ew_content)s::jsonb)) AS k(key, content)"
    " ON CONFLICT (branch_id, namespace_id, kind, slug) DO UPDATE SET"
    " content = EXCLUDED.content, deleted = FALSE, version = EXCLUDED.version,"
    " created_at = CASE WHEN branches_branchentity.deleted"
    "  THEN EXCLUDED.created_at ELSE branches_branchentity.created_at END,"
    " updated_at = EXCLUDED.updated_at, changeset_id = EXCLUDED.changeset_id RETURNING 1)"
)
_UPSERT_TOMBSTONES = (
    "et AS (INSERT INTO branches_branchentity (branch_id, namespace_id, kind, slug,"
    " content, deleted, version, base_version, created_at, updated_at, changeset_id)"
    " SELECT %(e_branch)s::bigint, k->>0, k->>1, k->>2, NULL, TRUE, NULL, (k->>3)::int,"
    " %(e_now)s::timestamptz, %(e_now)s::timestamptz, %(e_cs)s::uuid"
    f" FROM {writer.MARK_JOIN}, jsonb_array_elements(%(et_keys)s::jsonb) k"
    " ON CONFLICT (branch_id, namespace_id, kind, slug) DO UPDATE SET"
    " content = NULL, deleted = TRUE, version = NULL,"
    " updated_at = EXCLUDED.updated_at, changeset_id = EXCLUDED.changeset_id RETURNING 1)"
)


def close_branch(
    branch_id: int, *, status: str, now: datetime, merged_changeset_id: UUID | None = None
) -> None:
    """Mark the (locked) branch merged or abandoned and delete its overlay.

    The overlay is working state, not the log: the branch's changesets and
    revisions stay. Its rows go under the marker ``close:<branch id>``, the
    one the overlay's guard trigger lets delete this branch's rows
    (``entities.writer``); the statement clears it again.
    """
    Branch.objects.filter(pk=branch_id).update(
        status=str(status), closed_at=now, merged_changeset_id=merged_changeset_id
    )
    # Raw SQL buys setting, using and clearing the marker within one statement.
    with connection.cursor() as cursor:
        cursor.execute(_CLOSE_OVERLAY, [f"close:{branch_id}", branch_id])


_CLOSE_OVERLAY = (
    f"WITH {writer.MARK_JOIN} AS MATERIALIZED (SELECT set_config('atlas.writer', %s, true)),"
    f" d AS (DELETE FROM branches_branchentity o USING {writer.MARK_JOIN}"
    " WHERE o.branch_id = %s RETURNING 1)"
    f" SELECT {writer.done_sql('(SELECT count(*) FROM d)')}"
)


def overlay_stores_holding(keys: Sequence[EntityKey]) -> list[BranchStore]:
    """Stores of the open branches whose overlay holds live content for any of ``keys``.

    An erasure (``changesets.services.erase``) writes its ``EraseEntity``
    changeset on each of them; a branch without an overlay row for a key reads
    it through from baseline, which the erasure has already redacted.
    """
    if not keys:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT o.branch_id FROM branches_branchentity o"
            " JOIN branches_branch b ON b.id = o.branch_id"
            " JOIN (SELECT v->>0 AS ns, v->>1 AS kind, v->>2 AS slug"
            "  FROM jsonb_array_elements(%s::jsonb) v) k"
            "  ON o.namespace_id = k.ns AND o.kind = k.kind AND o.slug = k.slug"
            " WHERE b.status = %s AND NOT o.deleted ORDER BY o.branch_id",
            [_keys_json(list(keys)), str(BranchStatus.OPEN)],
        )
        ids = [row[0] for row in cursor.fetchall()]
    return [BranchStore(branch) for branch in Branch.objects.filter(pk__in=ids).order_by("pk")]
