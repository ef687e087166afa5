"""Retention: ``ATLAS_RETENTION_DAYS``, per-namespace retention, and the beat task.

A cut is one seq for the whole log, so a namespace's retention is a floor
(docs/retention.md): the cut goes where every namespace's floor allows, the
longest winning; a namespace that keeps for ever (no policy and no global)
stops retention altogether.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from changesets import tasks
from changesets.archive import retention
from changesets.archive.models import ArchiveCut, CutState, NamespaceRetention
from changesets.models import Changeset, LogHead
from tests.changesets.archive.conftest import NS_A, NS_B
from tests.entities.factories import NamespaceFactory

pytestmark = pytest.mark.django_db
NOW = timezone.now()


def _policy(**own: int):
    for name, days in own.items():
        NamespaceRetention.objects.create(namespace=NamespaceFactory(name=name), days=days)
    return retention.policy(NOW)


def test_without_any_retention_nothing_is_cut(db):
    NamespaceFactory(name="keep.all")
    assert retention.policy(NOW).before is None


def test_the_global_retention_applies_to_namespaces_without_their_own(settings):
    settings.ATLAS_RETENTION_DAYS = 30
    NamespaceFactory(name="plain.one")
    assert retention.policy(NOW).before == NOW - timedelta(days=30)


def test_the_longest_floor_wins(settings):
    settings.ATLAS_RETENTION_DAYS = 30
    NamespaceFactory(name="plain.one")
    wanted = _policy(**{"audit.two": 400, "short.three": 7})
    assert wanted.before == NOW - timedelta(days=400)
    assert "audit.two keeps 400" in wanted.reason


def test_a_namespace_that_keeps_for_ever_stops_retention(settings):
    settings.ATLAS_RETENTION_DAYS = 0
    NamespaceFactory(name="no.policy")
    wanted = _policy(**{"short.one": 7})
    assert wanted.before is None and "for ever" in wanted.reason


def test_when_every_namespace_has_its_own_the_longest_of_them_decides(settings):
    settings.ATLAS_RETENTION_DAYS = 0
    assert _policy(**{"a.one": 10, "a.two": 20}).before == NOW - timedelta(days=20)


def test_the_beat_task_cuts_with_the_same_archiver(seed, archive_dir, settings, monkeypatch):
    seeded = seed(2)
    settings.ATLAS_RETENTION_DAYS = 3
    NamespaceRetention.objects.create(namespace_id=NS_A, days=5)
    later = timezone.now() + timedelta(days=5, hours=1)
    monkeypatch.setattr(retention.timezone, "now", lambda: later)
    head = LogHead.objects.get().seq
    result = tasks.archive_retention.delay().get()
    assert result["status"] == "done", result
    assert result["policy"] == f"{NS_A} keeps 5 day(s)"
    done = ArchiveCut.objects.get()
    assert done.state == CutState.REMOVED and done.requested_by == "retention"
    assert done.seq == head and result["cuts"] == [head]
    assert not Changeset.objects.exists()
    assert seeded.root.username == "root"


def test_the_beat_task_keeps_recent_history_hot(seed, archive_dir, settings):
    seed(1)
    settings.ATLAS_RETENTION_DAYS = 3
    result = tasks.archive_retention.delay().get()
    assert result["status"] == "done" and result["cuts"] == []  # nothing is three days old
    assert not ArchiveCut.objects.exists()


def test_the_beat_task_is_a_no_op_without_retention(seed, archive_dir, settings):
    seed(1)
    result = tasks.archive_retention.delay().get()
    assert result["status"] == "nothing" and "keep history for ever" in result["policy"]
    assert not ArchiveCut.objects.exists()


def test_the_beat_task_without_a_key_says_so(seed, archive_dir, settings, monkeypatch):
    seed(1)
    settings.ATLAS_RETENTION_DAYS = 1
    settings.ATLAS_ARCHIVE_SIGNING_KEY = ""
    later = timezone.now() + timedelta(days=2)
    monkeypatch.setattr(retention.timezone, "now", lambda: later)
    result = tasks.archive_retention.delay().get()
    assert result["status"] == "failed" and "ATLAS_ARCHIVE_SIGNING_KEY" in result["error"]
    assert not ArchiveCut.objects.exists()


def test_retention_is_edited_in_the_admin_by_superusers_only(make_user, client):
    NamespaceFactory(name=NS_B)
    root = make_user("root", superuser=True)
    staff = make_user("clerk", staff=True)
    client.force_login(staff)
    assert client.get("/admin/changesets/namespaceretention/add/").status_code == 403
    client.force_login(root)
    response = client.post(
        "/admin/changesets/namespaceretention/add/", {"namespace": NS_B, "days": 90}
    )
    assert response.status_code == 302, response.content
    assert NamespaceRetention.objects.get(namespace_id=NS_B).days == 90
    bad = client.post("/admin/changesets/namespaceretention/add/", {"namespace": NS_B, "days": 0})
    assert bad.status_code == 200  # the form refuses 0 days (and a second policy)
