"""PostgreSQL refuses entity and overlay rows written behind the write service's back.

Invariant 1 held by the database (``entities/writer.py``): every bypass a host
project's code could take (ORM save, bulk writes, queryset update/delete, raw
SQL) is refused with an error naming the service to call, while the service
itself, on baseline and on branches, merge and abandon included, still writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import ProgrammingError, connection, transaction
from django.utils import timezone

from branches.models import Branch, BranchEntity
from branches.services import branch_abandon, branch_create, branch_merge
from branches.store import BranchStore
from changesets.hooks import in_write_transaction
from changesets.models import Rpc
from changesets.ops import DeleteOp, PutOp
from changesets.services.apply import changeset_apply
from entities.models import Entity
from entities.store import EntityKey, baseline
from entities.writer import changeset_marker

NS = "acme.orders"
REFUSED = "entity rows change only through the write service"
OVERLAY_REFUSED = "branch overlay rows change only through the write service"


def key(slug: str) -> EntityKey:
    return EntityKey(NS, "order", slug)


@pytest.fixture
def seeded(staff, namespace) -> Entity:
    """``acme.orders/order/a`` at version 1, written by the service."""
    changeset_apply(
        store=baseline, actor=staff, ops=[PutOp(key("a"), {"n": 1})], rpc=Rpc.PUT_ENTITY
    )
    return Entity.objects.get(slug="a")


def refused(attempt: Callable[[], Any], match: str = REFUSED) -> ProgrammingError:
    """Run ``attempt`` in a savepoint; it must fail with the guard's error (and hint)."""
    with pytest.raises(ProgrammingError, match=match) as info, transaction.atomic():
        attempt()
    hint = info.value.__cause__.diag.message_hint  # type: ignore[union-attr]
    assert "changeset_apply" in hint
    return info.value


def marker() -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('atlas.writer', true)")
        return cursor.fetchone()[0]


# --- every bypass of baseline is refused ------------------------------------------------


def test_orm_create_is_refused(seeded):
    now = timezone.now()
    refused(
        lambda: Entity.objects.create(
            namespace_id=NS,
            kind="order",
            slug="b",
            content={},
            version=1,
            created_at=now,
            updated_at=now,
            changeset_id=seeded.changeset_id,
        )
    )
    assert not Entity.objects.filter(slug="b").exists()


def test_orm_save_is_refused(seeded):
    seeded.content = {"n": 2}
    refused(seeded.save)
    assert Entity.objects.get(slug="a").content == {"n": 1}


def test_bulk_create_is_refused(seeded):
    now = timezone.now()
    rows = [
        Entity(
            namespace_id=NS,
            kind="order",
            slug=f"bulk{i}",
            content={},
            version=1,
            created_at=now,
            updated_at=now,
            changeset_id=seeded.changeset_id,
        )
        for i in range(3)
    ]
    refused(lambda: Entity.objects.bulk_create(rows))
    assert Entity.objects.count() == 1


def test_bulk_update_is_refused(seeded):
    seeded.content = {"n": 2}
    refused(lambda: Entity.objects.bulk_update([seeded], ["content"]))
    assert Entity.objects.get(slug="a").content == {"n": 1}


def test_queryset_update_is_refused(seeded):
    refused(lambda: Entity.objects.filter(slug="a").update(content={"n": 2}))
    assert Entity.objects.get(slug="a").content == {"n": 1}


def test_queryset_delete_is_refused(seeded):
    refused(lambda: Entity.objects.filter(slug="a").delete())
    assert Entity.objects.filter(slug="a").exists()


def test_instance_delete_is_refused(seeded):
    refused(seeded.delete)
    assert Entity.objects.filter(slug="a").exists()


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO entities_entity (namespace_id, kind, slug, content, version, created_at,"
        " updated_at, changeset_id) SELECT namespace_id, kind, 'raw', content, 1, now(), now(),"
        " changeset_id FROM entities_entity",
        "UPDATE entities_entity SET content = '{\"n\": 2}'",
        "DELETE FROM entities_entity",
    ],
    ids=["insert", "update", "delete"],
)
def test_raw_sql_is_refused(seeded, sql):
    def run() -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql)

    refused(run)
    assert list(Entity.objects.values_list("slug", "content")) == [("a", {"n": 1})]


def test_a_marker_for_another_changeset_writes_nothing(seeded):
    """The trigger accepts a row only under the marker of the changeset the row names."""

    def forged() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('atlas.writer', %s, true)", [changeset_marker(uuid.uuid4())]
            )
        Entity.objects.filter(slug="a").update(content={"n": 2})

    refused(forged)
    assert Entity.objects.get(slug="a").content == {"n": 1}


# --- the service still writes, and leaves no marker behind ------------------------------


def test_the_service_creates_updates_and_deletes_in_one_batch(seeded, staff):
    result = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(key("a"), {"n": 2}), PutOp(key("b"), {"n": 1}), PutOp(key("c"), {})],
        rpc=Rpc.BATCH_MUTATE,
    )
    assert [r.status for r in result.results] == ["updated", "created", "created"]
    changeset_apply(store=baseline, actor=staff, ops=[DeleteOp(key("c"))], rpc=Rpc.DELETE_ENTITY)
    rows = dict(Entity.objects.values_list("slug", "version"))
    assert rows == {"a": 2, "b": 1}


def test_code_later_in_the_write_transaction_cannot_ride_the_marker(seeded, staff):
    """A write hook runs in the write's transaction, after its log statement: the
    marker is cleared by then, and a direct write there is refused (and, refused,
    rolls the whole write back)."""
    seen: list[str | None] = []

    def hook(changeset: Any) -> None:
        seen.append(marker())
        Entity.objects.filter(slug="a").update(content={"n": 99})

    with pytest.raises(ProgrammingError, match=REFUSED), in_write_transaction(hook):
        changeset_apply(
            store=baseline, actor=staff, ops=[PutOp(key("a"), {"n": 2})], rpc=Rpc.PUT_ENTITY
        )
    assert seen == [""]
    assert Entity.objects.get(slug="a").content == {"n": 1}


def test_the_marker_is_cleared_even_when_the_write_changes_an_entity_of_its_own_changeset(
    staff, namespace
):
    """Inside a host's own transaction, after the service returns, nothing rides
    the marker, not even an update that keeps the row's (current) changeset id."""
    with transaction.atomic():
        result = changeset_apply(
            store=baseline, actor=staff, ops=[PutOp(key("a"), {"n": 1})], rpc=Rpc.PUT_ENTITY
        )
        assert marker() == ""
        refused(lambda: Entity.objects.filter(slug="a").update(content={"n": 2}))
    assert Entity.objects.get(slug="a").changeset_id == result.changeset.id


# --- branch overlays -------------------------------------------------------------------


@pytest.fixture
def branch(staff, seeded) -> Branch:
    """A branch with an overlay row for ``a`` (written by the service)."""
    made = branch_create(name="feature", actor=staff)
    changeset_apply(
        store=BranchStore(made, writer=staff),
        actor=staff,
        ops=[PutOp(key("a"), {"n": 5}), PutOp(key("new"), {"n": 1})],
        rpc=Rpc.BATCH_MUTATE,
    )
    return made


def test_overlay_bypasses_are_refused(branch):
    row = BranchEntity.objects.get(branch=branch, slug="a")
    row.content = {"n": 6}
    refused(row.save, OVERLAY_REFUSED)
    refused(
        lambda: BranchEntity.objects.filter(branch=branch).update(content={"x": 1}),
        OVERLAY_REFUSED,
    )
    refused(lambda: BranchEntity.objects.bulk_update([row], ["content"]), OVERLAY_REFUSED)
    refused(lambda: BranchEntity.objects.filter(branch=branch).delete(), OVERLAY_REFUSED)
    now = timezone.now()
    refused(
        lambda: BranchEntity.objects.create(
            branch=branch,
            namespace_id=NS,
            kind="order",
            slug="sneaky",
            content={},
            version=1,
            created_at=now,
            updated_at=now,
            changeset_id=row.changeset_id,
        ),
        OVERLAY_REFUSED,
    )

    def raw() -> None:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM branches_branchentity")

    refused(raw, OVERLAY_REFUSED)
    overlay = dict(BranchEntity.objects.filter(branch=branch).values_list("slug", "content"))
    assert overlay == {"a": {"n": 5}, "new": {"n": 1}}


def test_closing_one_branch_cannot_delete_another_branchs_overlay(staff, branch):
    """The close marker names its branch: it deletes only that branch's rows."""
    other = branch_create(name="other", actor=staff)
    changeset_apply(
        store=BranchStore(other, writer=staff),
        actor=staff,
        ops=[PutOp(key("o"), {"n": 1})],
        rpc=Rpc.PUT_ENTITY,
    )

    def ride() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('atlas.writer', %s, true)", [f"close:{branch.pk}"])
        BranchEntity.objects.filter(branch=other).delete()

    refused(ride, OVERLAY_REFUSED)
    assert BranchEntity.objects.filter(branch=other).count() == 1


def test_the_sync_marker_moves_only_base_versions_of_its_own_branch(staff, branch):
    """``sync:<branch id>`` (branches.sync) may change a row's base version, nothing else."""
    other = branch_create(name="other", actor=staff)
    changeset_apply(
        store=BranchStore(other, writer=staff),
        actor=staff,
        ops=[PutOp(key("o"), {"n": 1})],
        rpc=Rpc.PUT_ENTITY,
    )

    def under_sync(update: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT set_config('atlas.writer', %s, true)", [f"sync:{branch.pk}"]
                    )
                update()

        return run

    rows = BranchEntity.objects.filter(branch=branch, slug="a")
    refused(under_sync(lambda: rows.update(content={"n": 99})), OVERLAY_REFUSED)
    refused(under_sync(lambda: rows.update(base_version=9, version=9)), OVERLAY_REFUSED)
    refused(
        under_sync(lambda: BranchEntity.objects.filter(branch=other).update(base_version=9)),
        OVERLAY_REFUSED,
    )
    refused(under_sync(lambda: rows.delete()), OVERLAY_REFUSED)
    under_sync(lambda: rows.update(base_version=9))()
    assert rows.get().base_version == 9 and rows.get().content == {"n": 5}


def test_branch_writes_merge_and_abandon_still_work(staff, branch):
    changeset_apply(
        store=BranchStore(branch, writer=staff),
        actor=staff,
        ops=[DeleteOp(key("new")), PutOp(key("a"), {"n": 7})],
        rpc=Rpc.BATCH_MUTATE,
    )
    assert dict(BranchEntity.objects.filter(branch=branch).values_list("slug", "deleted")) == {
        "a": False,
        "new": True,
    }
    merged = branch_merge(branch=branch, actor=staff)
    assert merged.changeset is not None
    assert not BranchEntity.objects.filter(branch=branch).exists()
    assert Entity.objects.get(slug="a").content == {"n": 7}

    doomed = branch_create(name="doomed", actor=staff)
    changeset_apply(
        store=BranchStore(doomed, writer=staff),
        actor=staff,
        ops=[PutOp(key("a"), {"n": 8})],
        rpc=Rpc.PUT_ENTITY,
    )
    branch_abandon(branch=doomed, actor=staff)
    assert not BranchEntity.objects.filter(branch=doomed).exists()
    assert marker() == ""
