"""export_changesets / import_changesets: files in, files out, nothing half-applied."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from changesets.models import Changeset, Rpc
from changesets.principals import SYSTEM_USERNAME
from changesets.services.revert import changeset_revert
from entities.store import baseline

pytestmark = pytest.mark.django_db
NS = "acme.orders"


def state() -> dict[str, dict]:
    return {e.key.slug: e.content for e in baseline.list(namespaces=None, namespace=NS, limit=500)}


def test_export_writes_one_file_per_changeset_in_seq_order(staff, namespace, write, tmp_path):
    first = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    second = write(staff, f"{NS}/order/a", {"n": 2}).changeset
    call_command("export_changesets", "--out", str(tmp_path), "--no-progress")
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [
        f"{first.seq:012d}-{first.id}.ndjson",
        f"{second.seq:012d}-{second.id}.ndjson",
    ]
    lines = (tmp_path / files[1]).read_text().splitlines()
    assert json.loads(lines[0])["changeset_id"] == str(second.id)
    assert json.loads(lines[1]) == {
        "op": "update",
        "namespace": NS,
        "kind": "order",
        "slug": "a",
        "before": {"n": 1},
        "after": {"n": 2},
        "changed": ["/n"],
    }


def test_export_by_id_and_by_range(staff, namespace, write, tmp_path):
    made = [write(staff, f"{NS}/order/{i}", {"i": i}).changeset for i in range(4)]
    call_command("export_changesets", str(made[2].id), "--out", str(tmp_path / "one"))
    assert len(list((tmp_path / "one").iterdir())) == 1
    call_command(
        "export_changesets",
        "--out",
        str(tmp_path / "range"),
        "--from-seq",
        str(made[1].seq),
        "--to-seq",
        str(made[2].seq),
        "--no-progress",
    )
    assert len(list((tmp_path / "range").iterdir())) == 2
    with pytest.raises(CommandError, match="not a changeset id"):
        call_command("export_changesets", "nope", "--out", str(tmp_path))


def test_export_then_revert_then_import_restores_the_state(staff, namespace, write, tmp_path):
    write(staff, f"{NS}/order/a", {"n": 1})
    batch = write(staff, f"{NS}/order/b", {"n": 1}).changeset
    exported = state()
    call_command("export_changesets", str(batch.id), "--out", str(tmp_path), "--no-progress")
    changeset_revert(store=baseline, actor=staff, changeset_id=str(batch.id))
    assert "b" not in state()

    call_command("import_changesets", str(tmp_path), "--no-progress")

    assert state() == exported
    imported = Changeset.objects.order_by("-seq").first()
    assert imported.rpc == Rpc.IMPORT_CHANGESET
    assert imported.author_name == SYSTEM_USERNAME


def test_import_dry_run_writes_nothing(staff, namespace, write, tmp_path):
    created = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    call_command("export_changesets", str(created.id), "--out", str(tmp_path))
    write(staff, f"{NS}/order/a", None)  # delete, so the create's pre-image holds again
    before = Changeset.objects.count()
    call_command("import_changesets", str(tmp_path), "--dry-run", "--no-progress")
    assert Changeset.objects.count() == before
    assert state() == {}


def test_import_stops_at_the_first_refused_file_naming_it(staff, namespace, write, tmp_path):
    created = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    call_command("export_changesets", str(created.id), "--out", str(tmp_path))
    before = Changeset.objects.count()
    with pytest.raises(CommandError, match="preimage_mismatch"):
        call_command("import_changesets", str(tmp_path), "--no-progress")
    assert Changeset.objects.count() == before


def test_import_refuses_a_malformed_file_before_writing_anything(namespace, tmp_path):
    (tmp_path / "1.ndjson").write_text('{"schema_version": 2}\n')
    with pytest.raises(CommandError, match="Line 1"):
        call_command("import_changesets", str(tmp_path))


def test_import_as_a_user_applies_that_users_roles(make_user, staff, namespace, write, tmp_path):
    created = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    call_command("export_changesets", str(created.id), "--out", str(tmp_path))
    write(staff, f"{NS}/order/a", None)
    make_user("rita", reader=[NS])
    with pytest.raises(CommandError, match="writer"):
        call_command("import_changesets", str(tmp_path), "--user", "rita", "--no-progress")
    make_user("wes", writer=[NS])
    call_command("import_changesets", str(tmp_path), "--user", "wes", "--no-progress")
    assert Changeset.objects.order_by("-seq").first().author_name == "wes"
    assert state() == {"a": {"n": 1}}
