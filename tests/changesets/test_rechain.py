"""Migration 0018: a v1 log re-chained to v2, recorded, and v1 anchors still checked."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from changesets import chainv1
from changesets.models import ChainUpgrade, Changeset

pytestmark = pytest.mark.django_db(transaction=True)

NS = "acme.orders"
V1 = [("changesets", "0016_rpc_erase_restore_sync")]


def migrate(targets: list[tuple[str, str]]) -> None:
    MigrationExecutor(connection).migrate(targets)


def latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def v1_log() -> list[tuple[int, str]]:
    """(seq, hash) of the v1 log as it stands (raw SQL: the models are v2's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT seq, hash FROM changesets_changeset ORDER BY seq")
        return cursor.fetchall()


def verify_log(*args: str) -> str:
    out = io.StringIO()
    call_command("verify_log", "--no-progress", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def written(staff, namespace, write):
    for i in range(12):
        write(staff, f"{NS}/order/o{i % 4}", {"i": i, "pad": "x" * i, "nested": {"n": [i]}})
    write(staff, f"{NS}/order/o1", None, metadata={"ticket": "T-1"})
    return Changeset.objects.count()


def test_a_v1_log_is_rechained_recorded_and_v1_anchors_still_check(written):
    migrate(V1)  # back to the v1 chain, recomputed from the rows (0018's reverse)
    anchors = v1_log()
    assert len(anchors) == written
    with connection.cursor() as cursor:
        cursor.execute("SELECT hash FROM changesets_loghead WHERE id = 1")
        assert cursor.fetchone()[0] == anchors[-1][1]

    migrate(latest())
    assert "ok:" in verify_log()
    upgrade = ChainUpgrade.objects.get()
    assert (upgrade.seq, upgrade.v1_hash) == anchors[-1]
    assert upgrade.v2_hash == Changeset.objects.get(seq=written).hash != anchors[-1][1]
    assert upgrade.revisions == written
    assert [(c.seq, c.v1_hash) for c in Changeset.objects.order_by("seq")] == anchors
    out = verify_log("--v1-anchor", f"{anchors[4][0]}:{anchors[4][1]}")
    assert f"v1 anchor seq {anchors[4][0]} ok" in out
    with pytest.raises(SystemExit):
        verify_log("--v1-anchor", f"{anchors[4][0]}:{chainv1.GENESIS}")


def _set_first_after(value: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE changesets_revision DISABLE TRIGGER revision_append_only")
        cursor.execute(
            "UPDATE changesets_revision SET after = %s::jsonb"
            " WHERE id = (SELECT min(id) FROM changesets_revision)",
            [value],
        )
        cursor.execute("ALTER TABLE changesets_revision ENABLE TRIGGER revision_append_only")


def test_a_log_that_does_not_verify_as_v1_is_not_rechained(written):
    migrate(V1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT after::text FROM changesets_revision ORDER BY id LIMIT 1")
        original = cursor.fetchone()[0]
    _set_first_after('{"i": 99}')
    with pytest.raises(Exception, match="v1 chain breaks at seq 1"):
        migrate(latest())
    _set_first_after(original)  # as written: now it re-chains
    migrate(latest())
    assert "ok:" in verify_log()
