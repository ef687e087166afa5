"""Fixtures for branch tests: a branch, and writes on it through the write service."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from branches.models import Branch, BranchEntity
from branches.services import branch_create
from branches.store import BranchStore
from changesets.models import Rpc
from changesets.ops import DeleteOp, PatchOp, PutOp, WriteOp
from changesets.services.apply import ApplyResult, changeset_apply
from entities.store import EntityKey
from tests.entities.factories import UserFactory

NS = "acme.orders"
BRANCH_HEADER = "HTTP_X_ATLAS_BRANCH"


def key(path: str) -> EntityKey:
    """``key("acme.orders/order/o-1")``."""
    return EntityKey(*path.split("/"))


def op_for(path: str, content: dict | None, *, patch: bool = False) -> WriteOp:
    k = key(path)
    if content is None:
        return DeleteOp(k)
    return PatchOp(k, content) if patch else PutOp(k, content)


def overlay(branch: Branch) -> dict[EntityKey, BranchEntity]:
    return {
        EntityKey(row.namespace_id, row.kind, row.slug): row
        for row in BranchEntity.objects.filter(branch=branch)
    }


@pytest.fixture
def superuser(db) -> Any:
    """Can do everything (superuser = every role everywhere; ``is_staff`` alone grants none)."""
    return UserFactory(username="root", is_superuser=True, is_staff=True)


@pytest.fixture
def make_branch(db) -> Callable[..., Branch]:
    """``make_branch(actor, "feature")``: create through the service."""

    def make(actor: Any, name: str = "feature", comment: str = "") -> Branch:
        return branch_create(name=name, actor=actor, comment=comment)

    return make


@pytest.fixture
def bwrite() -> Callable[..., ApplyResult]:
    """Write on a branch through the service: ``bwrite(actor, branch, "ns/kind/slug", {...})``.

    ``None`` deletes; ``ops=[...]`` writes a batch instead. The store writes on
    behalf of ``actor`` (as ``store_for`` makes it), so the branch's writer rule
    applies.
    """

    def apply(
        actor: Any,
        branch: Branch,
        path: str | None = None,
        content: dict | None = None,
        *,
        ops: list[WriteOp] | None = None,
        patch: bool = False,
        **kw: Any,
    ) -> ApplyResult:
        if ops is None:
            assert path is not None
            ops = [op_for(path, content, patch=patch)]
            rpc = Rpc.DELETE_ENTITY if content is None else Rpc.PUT_ENTITY
        else:
            rpc = Rpc.BATCH_MUTATE
        store = BranchStore(branch, writer=actor)
        return changeset_apply(store=store, actor=actor, ops=ops, rpc=rpc, **kw)

    return apply


@pytest.fixture
def wendy(writer):
    """The branch tests' writer of ``acme.orders``."""
    return writer


@pytest.fixture
def api(client_for, wendy):
    return client_for(wendy)
