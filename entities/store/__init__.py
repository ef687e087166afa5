"""The entity store interface and its baseline implementation.

The write service (``changesets.services.apply``) takes a store, so the same code
writes baseline and branch overlays, and ``changesets`` never imports
``branches``. Every method here is set-based: one statement for any number of
keys, so a 1,000-op batch costs a handful of round trips.

Only the write service may call the mutating methods (DESIGN invariant 1).
"""

from entities.store.baseline import BaselineStore, baseline
from entities.store.interface import (
    NO_WRITES,
    EntityKey,
    EntityStore,
    EntityWrite,
    KeyRaced,
    Locked,
    OptimisticStore,
    StoredEntity,
    WriteSql,
    guard_allows,
    namespaces_of,
)
from entities.store.sql import (
    contents_json,
    counted,
    entity_filters,
    json_array,
    like_prefix,
    load_json,
    row_to_entity,
)

__all__ = [
    "NO_WRITES",
    "BaselineStore",
    "EntityKey",
    "EntityStore",
    "EntityWrite",
    "KeyRaced",
    "Locked",
    "OptimisticStore",
    "StoredEntity",
    "WriteSql",
    "baseline",
    "contents_json",
    "counted",
    "entity_filters",
    "guard_allows",
    "json_array",
    "like_prefix",
    "load_json",
    "namespaces_of",
    "row_to_entity",
]
