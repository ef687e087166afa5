""":class:`BranchStore`, a branch's overlay over baseline, and the stores an erasure
must also write (:func:`overlay_stores_holding`).

The SQL its writes add to the log statement is :mod:`branches.store.overlay_writes`;
the branch-row lock and checks it shares with every branch write are
:mod:`branches.store.branch_row`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.db import connection

from branches.models import Branch, BranchStatus
from branches.store.branch_row import lock_branch_row, require_open, require_writer
from branches.store.overlay_writes import Seen as _Seen
from branches.store.overlay_writes import keys_json as _keys_json
from branches.store.overlay_writes import overlay_write_sql
from entities.store import (
    EntityKey,
    EntityWrite,
    Locked,
    StoredEntity,
    WriteSql,
    counted,
    entity_filters,
    guard_allows,
    namespaces_of,
    row_to_entity,
)

if TYPE_CHECKING:
    from entities.access import WriteGuard

_VIEW_COLUMNS = "namespace_id, kind, slug, content, version, created_at, updated_at, changeset_id"


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
        self._record_namespaces(touched)
        return overlay_write_sql(
            branch_id=self.branch_id,
            changeset_id=changeset_id,
            now=now,
            seen=seen,
            creates=creates,
            updates=updates,
            deletes=deletes,
        )

    def _record_namespaces(self, touched: set[str]) -> None:
        """Add the namespaces this write touches to the branch's set, if any is new."""
        if not touched <= self._namespaces:
            self._namespaces |= touched
            Branch.objects.filter(pk=self.branch_id).update(namespaces=sorted(self._namespaces))


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
