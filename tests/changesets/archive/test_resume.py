"""A cut survives a crash at every step: a real ``archive_log`` process is SIGKILLed there.

``--pause-at`` stops the process at a named point (after each step, after a
segment, after a removal batch); the test kills it with SIGKILL there, checks
that nothing was removed that was not written and verified, runs the command
again and checks the result is the archive an uninterrupted run makes: every
changeset of the export taken before in the segments, the archive verifying
offline, ``verify_log`` passing from the checkpoint.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from changesets import partitions
from changesets.archive import boundary, hot, offline
from changesets.archive.models import ArchiveCut, ArchiveSegment, CutState, SegmentState
from changesets.management.commands.archive_log import PAUSE_POINTS
from changesets.models import Changeset, Revision
from tests.changesets.archive.conftest import KEY, full_export, public_key
from tests.changesets.partition_helpers import layout
from tests.reliability.harness import BASE_DIR, child_env, database_url_of_tests, manage

pytestmark = pytest.mark.django_db(transaction=True)


def _env(folder: Path) -> dict[str, str]:
    return child_env(
        database_url_of_tests(),
        ATLAS_ARCHIVE_SIGNING_KEY=KEY,
        ATLAS_ARCHIVE_DIR=str(folder),
        ATLAS_ARCHIVE_GRACE_SECONDS=0,
        ATLAS_ARCHIVE_SEGMENT_REVISIONS=7,
        ATLAS_ARCHIVE_DELETE_BATCH=3,
    )


def _killed_at(point: str, before: int, folder: Path) -> None:
    """Run archive_log until it pauses at ``point``, then SIGKILL it."""
    process = subprocess.Popen(
        [sys.executable, "manage.py", "archive_log", "--before", str(before), "--no-progress",
         "--pause-at", point],
        cwd=BASE_DIR, env=_env(folder), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    seen = ""
    assert process.stderr is not None
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        seen += line
        if line.startswith(f"PAUSED {point}"):
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            return
        if not line and process.poll() is not None:
            break
    process.kill()
    pytest.fail(f"archive_log never paused at {point}: {seen}")


def _archived_ids(folder: Path) -> list[str]:
    ids = []
    for path in sorted((folder / "segments").glob("*.ndjson.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            ids += [json.loads(x)["changeset_id"] for x in handle if '"schema_version"' in x]
    return ids


@pytest.mark.parametrize("point", PAUSE_POINTS)
def test_a_cut_killed_at_each_step_finishes_on_the_next_run(point, seed, tmp_path):
    if point == "removal-batch":
        # Changesets on one wide partition, so the cut straddles it: the batched
        # DELETE runs (on the aligned layout both tables go by partition).
        layout([(0, 1_000_000)], parents=[partitions.CHANGESETS])
    seeded = seed(3)
    target = seeded.seq_of(9)
    export = full_export()
    folder = tmp_path / "archive"

    _killed_at(point, target + 1, folder)

    boundary.forget()
    state = ArchiveCut.objects.get().state
    written_or_better = {SegmentState.WRITTEN, SegmentState.VERIFIED}
    unverified = ArchiveSegment.objects.exclude(state=SegmentState.VERIFIED).exists()
    if state not in (CutState.SWITCHED, CutState.REMOVED) or unverified:
        # Nothing may be gone unless every segment was written and verified.
        assert Changeset.objects.filter(seq__lte=target).count() == target
    if point == "partition-detached":  # detached, not dropped: the next run drops it
        assert [name for name, _ in hot._detached()]
    if point in ("partition-detached", "partition-dropped"):
        assert Changeset.objects.filter(seq__lte=target).count() == target  # DELETEs come later
        assert Revision.objects.filter(seq__lte=target).count() > 0
    if point == "removal-batch":
        assert 0 < Changeset.objects.filter(seq__lte=target).count() < target
    assert all(
        s.state in written_or_better or s.state == SegmentState.PLANNED
        for s in ArchiveSegment.objects.all()
    )

    again = manage(database_url_of_tests(), "archive_log", "--no-progress", **{
        k: v for k, v in _env(folder).items() if k.startswith("ATLAS_ARCHIVE")
    })  # fmt: skip
    assert again.returncode == 0, again.stderr
    boundary.forget()

    done = ArchiveCut.objects.get()
    assert done.state == CutState.REMOVED and done.seq == target
    assert not Changeset.objects.filter(seq__lte=target).exists()
    assert not Revision.objects.filter(seq__lte=target).exists()
    expected = [cid for cid, row in sorted(export.items(), key=lambda i: i[1]["seq"])
                if row["seq"] <= target]  # fmt: skip
    assert _archived_ids(folder) == expected
    report = offline.verify_archive(offline.DirectorySource(folder), public_keys=[public_key()])
    assert report.ok, report.problems
    call_command("verify_log", "--no-progress", stdout=StringIO())  # exits 1 on a break


def test_a_segment_half_written_by_a_crash_is_written_again(seed, tmp_path):
    seeded = seed(3)
    target = seeded.seq_of(8)
    folder = tmp_path / "archive"
    _killed_at("planned", target + 1, folder)
    first = ArchiveSegment.objects.order_by("first_seq").first()
    (folder / first.name).parent.mkdir(parents=True, exist_ok=True)
    (folder / first.name).write_bytes(b"\x1f\x8b half a file")  # what a crash mid-write leaves
    again = manage(database_url_of_tests(), "archive_log", "--no-progress", **{
        k: v for k, v in _env(folder).items() if k.startswith("ATLAS_ARCHIVE")
    })  # fmt: skip
    assert again.returncode == 0, again.stderr
    report = offline.verify_archive(offline.DirectorySource(folder), public_keys=[public_key()])
    assert report.ok, report.problems


def test_a_segment_damaged_after_it_was_written_is_refused_then_written_again(seed, tmp_path):
    seeded = seed(3)
    target = seeded.seq_of(8)
    folder = tmp_path / "archive"
    _killed_at("written", target + 1, folder)
    first = ArchiveSegment.objects.order_by("first_seq").first()
    (folder / first.name).write_bytes(b"damaged")
    env = {k: v for k, v in _env(folder).items() if k.startswith("ATLAS_ARCHIVE")}
    refused = manage(database_url_of_tests(), "archive_log", "--no-progress", **env)
    assert refused.returncode == 1 and "run archive_log again" in refused.stderr
    assert Changeset.objects.filter(seq__lte=target).count() == target  # nothing removed
    again = manage(database_url_of_tests(), "archive_log", "--no-progress", **env)
    assert again.returncode == 0, again.stderr
    assert offline.verify_archive(offline.DirectorySource(folder), public_keys=[public_key()]).ok
