"""The overlay's share of a branch changeset's log statement: two upserts, as CTEs.

:meth:`branches.store.BranchStore.write_sql` builds them with
:func:`overlay_write_sql` from what its ``lock`` saw (:class:`Seen`); the
write service runs them inside the one statement that writes the log.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from entities import writer
from entities.store import EntityKey, EntityWrite, WriteSql, contents_json


def keys_json(keys: Sequence[EntityKey], *extra: Sequence[Any]) -> str:
    """``[[namespace, kind, slug, *extra], …]`` as one JSON document, the write
    path's one way of passing many keys (see ``entities.store.json_array``)."""
    return json.dumps(
        [[k.namespace, k.kind, k.slug, *more] for k, *more in zip(keys, *extra, strict=True)]
    )


@dataclass(frozen=True)
class Seen:
    """What ``lock`` saw of a key that has no overlay row yet."""

    base_version: int | None  # baseline's version, None when absent
    base_created_at: datetime | None


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


def overlay_write_sql(
    *,
    branch_id: int,
    changeset_id: UUID,
    now: datetime,
    seen: Mapping[EntityKey, Seen],
    creates: Sequence[EntityWrite],
    updates: Sequence[EntityWrite],
    deletes: Sequence[EntityKey],
) -> WriteSql:
    """The changeset's net effect on branch ``branch_id``'s overlay, as CTEs.

    Creates and updates are one upsert (content, :data:`_UPSERT_LIVE`), deletes
    one upsert of tombstones (:data:`_UPSERT_TOMBSTONES`); both count their
    rows for the writer marker. Nothing to write: no CTE.
    """
    writes = [*creates, *updates]
    # Raw SQL buys the round trip: these CTEs ride the log statement.
    ctes: list[str] = []
    counts: list[str] = []
    params: dict[str, Any] = {"e_branch": branch_id, "e_now": now, "e_cs": changeset_id}
    if writes:
        ctes.append(_UPSERT_LIVE)
        params["ew_keys"] = _live_keys_json(writes, len(creates), seen, now)
        params["ew_content"] = contents_json(writes)
        counts.append("(SELECT count(*) FROM ew)")
    if deletes:
        ctes.append(_UPSERT_TOMBSTONES)
        params["et_keys"] = keys_json(deletes, [_base(seen, k) for k in deletes])
        counts.append("(SELECT count(*) FROM et)")
    if not ctes:
        return WriteSql("", params, "0", "0", 0)
    # The marker first, so that both upserts may join it (entities.writer).
    ctes.insert(0, writer.MARK_CTE)
    return WriteSql(", ".join(ctes), params, "0", writer.done_sql(" + ".join(counts)), 0)


def _live_keys_json(
    writes: Sequence[EntityWrite], n_creates: int, seen: Mapping[EntityKey, Seen], now: datetime
) -> str:
    """The upserted keys with version, ``base_version`` and ``created_at``, in ``writes``
    order (its first ``n_creates`` are the creates)."""
    keys = [w.key for w in writes]
    return keys_json(
        keys,
        [w.version for w in writes],
        [_base(seen, k) for k in keys],
        [_born(seen, k, i >= n_creates, now) for i, k in enumerate(keys)],
    )


def _base(seen: Mapping[EntityKey, Seen], key: EntityKey) -> int | None:
    """A key's first write on the branch records the baseline version ``lock`` saw."""
    first = seen.get(key)
    return first.base_version if first else None


def _born(seen: Mapping[EntityKey, Seen], key: EntityKey, updated: bool, now: datetime) -> str:
    # An entity first written here keeps baseline's created_at when it
    # existed there; a create (or re-create) is born now.
    first = seen.get(key)
    at = first.base_created_at if first and updated else None
    return (at or now).isoformat()
