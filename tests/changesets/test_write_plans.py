"""The write statements find their rows by index whatever the table's size.

The keys of a write go over as one JSON document unpacked by
``jsonb_array_elements``, which PostgreSQL always estimates at 100 rows. Left
at that, a single write into a table of a few thousand entities was planned
as a hash join over a sequential scan of the whole table (about 1 ms at
4,500 rows, against 0.05 ms by index), so a write cost more the more
entities there were, up to the size where the planner flips. Each statement
now tells the planner how many keys it carries; these tests pin the plans on
a table big enough to have shown the scan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from changesets.models import Rpc
from changesets.ops import DeleteOp, PutOp, WriteOp
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, EntityStore, baseline

pytestmark = pytest.mark.django_db
NS = "acme.orders"
ROWS = 5000


def key(slug: str) -> EntityKey:
    return EntityKey(NS, "order", slug)


@pytest.fixture
def many_entities(staff: Any, namespace: Any) -> None:
    """``ROWS`` entities in one namespace (through the service, as one batch), analyzed."""
    changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(key(f"o-{n}"), {"n": n}) for n in range(ROWS)],
        rpc=Rpc.BATCH_MUTATE,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE entities_entity")


def plans_of(store: EntityStore, actor: Any, ops: list[WriteOp], wanted: Callable[[str], bool]):
    """EXPLAIN of every statement the write runs that ``wanted`` picks (run as planned,
    on the same connection, so prepared or not, the plan is the one PostgreSQL uses)."""
    seen: list[tuple[str, Any]] = []

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if wanted(sql):
            seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        changeset_apply(store=store, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE)
    assert seen, "no statement matched"
    plans = []
    with connection.cursor() as cursor:
        for sql, params in seen:
            cursor.execute("EXPLAIN " + sql, params)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    return plans


def writes_entities(sql: str) -> bool:
    return "changesets_loghead" in sql


@pytest.mark.parametrize("size", [1, 3])
def test_an_update_finds_its_rows_by_index(many_entities, staff, size):
    ops: list[WriteOp] = [PutOp(key(f"o-{n}"), {"n": -n}) for n in range(1, size + 1)]
    for plan in plans_of(baseline, staff, ops, writes_entities):
        assert "Seq Scan on entities_entity" not in plan, plan
        assert "entity_key_unique" in plan, plan


def test_a_delete_finds_its_rows_by_index(many_entities, staff):
    ops: list[WriteOp] = [DeleteOp(key("o-7"))]
    for plan in plans_of(baseline, staff, ops, writes_entities):
        assert "Seq Scan on entities_entity" not in plan, plan
        assert "entity_key_unique" in plan, plan


@pytest.mark.parametrize("size", [1, 3])
def test_the_lock_finds_its_rows_by_index(many_entities, staff, size):
    """One key goes as three parameters, more as a JSON document with its count."""
    ops: list[WriteOp] = [PutOp(key(f"o-{n}"), {"n": -n}) for n in range(9, 9 + size)]
    for plan in plans_of(baseline, staff, ops, lambda sql: "FOR UPDATE OF e" in sql):
        assert "Seq Scan on entities_entity" not in plan, plan
        assert "entity_key_unique" in plan, plan
