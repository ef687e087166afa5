"""Erasure of archived data: the segments rewritten, the checkpoint re-signed, recorded.

An erased value must leave the archive as it leaves the tables: every segment
holding it is written anew with ``"[erased]"`` (the chain still verifying by
the kept digests), the checkpoint is re-signed, the old files go, and an
``ArchiveRewrite`` records it. The state at the cut (a table) is redacted in
the erasure's own transaction. An erasure that lands while a cut is being
made, before it is signed, is taken into its segments before the signature.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from django.db import connection

from changesets.archive import archiver, erasure, offline
from changesets.archive.models import ArchiveCut, ArchiveRewrite, CutState, RewriteState
from changesets.models import LogHead
from changesets.services.erase import EraseTarget, entities_erase
from tests.changesets.archive.conftest import NS_A, cut, key, public_key

pytestmark = pytest.mark.django_db
SECRET = "secret-phone-0123456789"


def _archive_text(folder: Path) -> str:
    text = ""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            raw = path.read_bytes()
            text += gzip.decompress(raw).decode() if path.suffix == ".gz" else raw.decode()
    return text


def _table_text() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT string_agg(t::text, '') FROM changesets_archivebase t")
        return cursor.fetchone()[0] or ""


@pytest.fixture
def with_secret(seed, write, publish_committed):
    seeded = seed(2)
    write(seeded.root, f"{NS_A}/doc/person", {"phone": SECRET, "name": "P"})
    write(seeded.root, f"{NS_A}/doc/person", {"phone": SECRET, "name": "Q"})
    publish_committed()
    return seeded


def _erase(actor):
    return entities_erase(
        actor=actor, targets=[EraseTarget(key(f"{NS_A}/doc/person"), ("/phone",))],
        reason="a person asked",
    )  # fmt: skip


def test_an_erasure_rewrites_the_segments_and_re_signs_the_checkpoint(with_secret, archive_dir):
    head = LogHead.objects.get().seq
    cut(head + 1)  # everything, the secret included
    assert SECRET in _archive_text(archive_dir) and SECRET in _table_text()
    old_names = set(ArchiveCut.objects.get().segments.values_list("name", flat=True))

    _erase(with_secret.root)

    assert SECRET not in _archive_text(archive_dir)
    assert SECRET not in _table_text()
    done = ArchiveCut.objects.get()
    assert done.rewrites == 1 and done.checkpoint["version"] == 1
    [record] = ArchiveRewrite.objects.all()
    assert record.state == RewriteState.DONE and record.segments
    assert {r["old"] for r in record.segments} <= old_names
    assert not any((archive_dir / r["old"]).exists() for r in record.segments)
    assert [p.name for p in (archive_dir / "checkpoints").iterdir()] == [f"{done.seq:012d}.v1.json"]
    report = offline.verify_archive(
        offline.DirectorySource(archive_dir), public_keys=[public_key()]
    )
    assert report.ok, report.problems  # the chain and the state digest still verify


def test_the_admin_lists_the_rewrites_for_superusers(with_secret, archive_dir, client):
    cut(LogHead.objects.get().seq + 1)
    _erase(with_secret.root)
    client.force_login(with_secret.root)
    page = client.get("/admin/changesets/archiverewrite/")
    assert page.status_code == 200 and "done" in page.content.decode()
    record = ArchiveRewrite.objects.get()
    assert client.get(f"/admin/changesets/archiverewrite/{record.pk}/change/").status_code == 200


def test_an_erasure_before_the_signature_goes_into_the_segments_first(with_secret, archive_dir):
    head = LogHead.objects.get().seq

    class Stop(Exception):
        pass

    def stop_at_verified(point: str) -> None:
        if point == "verified":
            raise Stop

    with pytest.raises(Stop):
        archiver.archive(before=head + 1, requested_by="test", pause=stop_at_verified)
    assert ArchiveCut.objects.get().state == CutState.VERIFIED
    assert SECRET in _archive_text(archive_dir)

    _erase(with_secret.root)  # the cut is not signed: no rewrite record, the archiver looks
    assert not ArchiveRewrite.objects.exists()

    cut(None)  # resume
    done = ArchiveCut.objects.get()
    assert done.state == CutState.REMOVED and done.rewrites == 1
    assert SECRET not in _archive_text(archive_dir)
    report = offline.verify_archive(
        offline.DirectorySource(archive_dir), public_keys=[public_key()]
    )
    assert report.ok, report.problems


def test_a_rewrite_left_pending_is_finished_by_the_next_run(with_secret, archive_dir, monkeypatch):
    head = LogHead.objects.get().seq
    cut(head + 1)
    monkeypatch.setattr(erasure, "after_commit", lambda: None)  # the process died after COMMIT
    _erase(with_secret.root)
    assert ArchiveRewrite.objects.get().state == RewriteState.PENDING
    assert SECRET in _archive_text(archive_dir)
    outcome = cut(None)
    assert outcome.rewrites == 1
    assert ArchiveRewrite.objects.get().state == RewriteState.DONE
    assert SECRET not in _archive_text(archive_dir)


def test_an_erasure_elsewhere_leaves_the_archive_alone(with_secret, archive_dir, make_user, write):
    head = LogHead.objects.get().seq
    cut(head + 1)
    make_user("other-maker", maintainer=["arch.other"])
    write(with_secret.root, "arch.other/doc/x", {"mail": "m@x.test"})
    target = EraseTarget(key("arch.other/doc/x"), ("/mail",))
    entities_erase(actor=with_secret.root, targets=[target], reason="unrelated")
    assert not ArchiveRewrite.objects.exists()
    assert ArchiveCut.objects.get().rewrites == 0
