"""A branch write reads the baseline rows it shadows by index, however many there are
(the reason is in ``tests/changesets/test_write_plans.py``)."""

from __future__ import annotations

import pytest

from branches.services import branch_create
from branches.store import BranchStore
from changesets.ops import PutOp, WriteOp
from tests.changesets.test_write_plans import key, many_entities, plans_of  # noqa: F401

pytestmark = pytest.mark.django_db


def test_a_branch_write_reads_baseline_by_index(many_entities, staff):  # noqa: F811
    branch = branch_create(name="feature", actor=staff, comment="")
    ops: list[WriteOp] = [PutOp(key("o-11"), {"n": -11})]
    store = BranchStore(branch, writer=staff)
    for plan in plans_of(store, staff, ops, lambda sql: "FOR SHARE OF e" in sql):
        assert "Seq Scan on entities_entity" not in plan, plan
        assert "entity_key_unique" in plan, plan
