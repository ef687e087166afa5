"""An archive cut end to end, in this process: segments, checkpoint, removal, verification.

What the issue's "Done when" asks of a cut: archive a seeded log, verify it
offline, nothing archived missing from the segments (compared with a full
export taken before), verify_log through the cut, as-of reads after the cut
unaffected, and a second cut continuing the first.
"""

from __future__ import annotations

import gzip
import importlib
import json
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from changesets import ndjson
from changesets.archive import base, boundary, checkpoint, locks, offline, segments, signing
from changesets.archive.models import ArchiveBase, ArchiveCut, CutState
from changesets.models import Changeset, JournalEntry, LogHead, Revision
from changesets.selectors import asof, diff
from changesets.selectors.restore import scope_as_of
from entities.store import EntityKey
from tests.changesets.archive.conftest import (
    KEY,
    NS_A,
    NS_B,
    cut,
    full_export,
    key,
    public_key,
)
from tests.reliability.harness import database_url_of_tests

pytestmark = pytest.mark.django_db


def _segment_lines(folder: Path) -> list[dict]:
    lines = []
    for path in sorted((folder / "segments").iterdir()):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            lines += [json.loads(line) for line in handle]
    return lines


def _without_chain(obj: dict) -> str:
    return json.dumps({k: v for k, v in obj.items() if k != "chain"}, ensure_ascii=False,
                      separators=(",", ":"))  # fmt: skip


def _as_of_everything(seqs: list[int]) -> dict[int, list]:
    """As-of reads at several points: both namespaces' listings, single keys, a diff."""
    out: dict[int, list] = {}
    for seq in seqs:
        listing = [(e.key, e.content, e.version, e.created_at, e.updated_at, e.changeset_id)
                   for e in asof.entities_as_of(seq=seq, namespaces=None, limit=500)]  # fmt: skip
        single = [asof.entity_as_of(seq=seq, key=key(f"{NS_A}/doc/a")),
                  asof.entity_as_of(seq=seq, key=key(f"{NS_B}/doc/gone"))]  # fmt: skip
        scope = scope_as_of(seq=seq, namespace=NS_A, limit=500)
        out[seq] = [listing, single, scope]
    return out


def test_a_cut_moves_the_log_into_verified_segments_and_out_of_the_hot_tables(seed, archive_dir):
    seeded = seed(3)
    target = seeded.seq_of(9)
    outcome = cut(target + 1)

    [done] = outcome.cuts
    assert done.state == CutState.REMOVED and done.seq == target
    assert not Changeset.objects.filter(seq__lte=target).exists()
    assert not Revision.objects.filter(seq__lte=target).exists()
    assert not JournalEntry.objects.filter(seq__lte=target).exists()
    assert Changeset.objects.filter(seq=target + 1).exists()
    assert done.segments.count() >= 2  # ATLAS_ARCHIVE_SEGMENT_REVISIONS is 7 here

    report = offline.verify_archive(
        offline.DirectorySource(archive_dir), public_keys=[public_key()]
    )
    assert report.ok, report.problems
    assert (report.changesets, report.head_seq, report.head_hash) == (target, target, done.hash)
    assert report.erased_members > 0  # the seed erased an email before the cut


def test_the_first_hot_changeset_chains_from_the_cut(seed, archive_dir):
    """A row stores no prev_hash (migration 0034); the first one after a cut finds
    its previous hash in the cut, whose changesets are gone, and so does the
    0034 reverse, which writes it in."""
    from changesets.archive.models import ArchiveCut
    from changesets.selectors.log import previous_hash

    seeded = seed(2)
    target = seeded.seq_of(5)
    cut(target + 1)
    first = Changeset.objects.order_by("seq").first()
    assert first.seq == target + 1 and first.prev_hash is None
    assert previous_hash(first) == ArchiveCut.objects.get(seq=target).hash
    with connection.cursor() as cursor:
        reverse = importlib.import_module("changesets.migrations.0034_changeset_prev_hash_derived")
        cursor.execute(reverse.FILL)
    filled = [c.prev_hash for c in Changeset.objects.order_by("seq")]
    hashes = [ArchiveCut.objects.get(seq=target).hash] + [
        c.hash for c in Changeset.objects.order_by("seq")
    ]
    assert filled == hashes[:-1]


def test_nothing_archived_is_missing_from_the_segments(seed, archive_dir):
    seeded = seed(3)
    before = full_export()
    target = seeded.seq_of(9)
    cut(target + 1)

    lines = _segment_lines(archive_dir)
    envelopes = [line for line in lines if "schema_version" in line]
    archived = {e["changeset_id"]: e for e in envelopes}
    expected = {cid: row for cid, row in before.items() if row["seq"] <= target}
    assert set(archived) == set(expected)
    # Line for line, the segments are the export (less the chain material) ...
    flat = [_without_chain(line) for line in lines if "atlas_archive_segment" not in line]
    exported = [
        line.rstrip("\n")
        for row in sorted(expected.values(), key=lambda r: r["seq"])
        for line in row["lines"]
    ]
    assert flat == exported
    # ... and the chain material is the rows'.
    for cid, row in expected.items():
        chain = archived[cid]["chain"]
        assert (chain["seq"], chain["hash"], chain["prev_hash"]) == (
            row["seq"], row["hash"], row["prev_hash"],
        )  # fmt: skip
    ops = [line for line in lines if "op" in line]
    salts = [op["chain"]["salt"] for op in ops]
    assert salts == [
        s for r in sorted(expected.values(), key=lambda r: r["seq"]) for s in r["salts"]
    ]


def test_the_checkpoint_is_signed_by_the_configured_key_and_published(seed, archive_dir):
    seeded = seed(2)
    cut(seeded.seq_of(5) + 1)
    done = ArchiveCut.objects.get()
    signed = checkpoint.published(done)
    assert signing.verify(signed, signing.load_public_key(public_key()))
    assert not signing.verify(
        {**signed, "seq": signed["seq"] + 1}, signing.load_public_key(public_key())
    )
    [name] = [p.name for p in (archive_dir / "checkpoints").iterdir()]
    stored = json.loads((archive_dir / "checkpoints" / name).read_text())
    assert stored == signed
    assert stored["public_key"] == public_key() and stored["algorithm"] == "Ed25519"


def test_verify_log_starts_from_the_checkpoint_and_verifies_through_the_cut(seed, archive_dir):
    seeded = seed(3)
    target = seeded.seq_of(7)
    cut(target + 1)
    out = StringIO()
    call_command("verify_log", "--no-progress", stdout=out)
    head = LogHead.objects.get()
    text = out.getvalue()
    assert f"checkpoint: seq {target}" in text
    assert f"ok: {head.seq - target} changeset(s) verified" in text


def test_verify_log_refuses_a_forged_checkpoint_or_state(seed, archive_dir):
    seeded = seed(2)
    cut(seeded.seq_of(5) + 1)
    done = ArchiveCut.objects.get()
    forged = {**done.checkpoint, "hash": "0" * 64}
    ArchiveCut.objects.filter(pk=done.pk).update(checkpoint=forged)
    with pytest.raises(SystemExit):
        call_command("verify_log", "--no-progress", stdout=StringIO(), stderr=StringIO())
    ArchiveCut.objects.filter(pk=done.pk).update(checkpoint=done.checkpoint)
    call_command("verify_log", "--no-progress", stdout=StringIO())
    ArchiveBase.objects.filter(valid_from=done.seq).update(after_version=99)
    err = StringIO()
    with pytest.raises(SystemExit):
        call_command("verify_log", "--no-progress", stdout=StringIO(), stderr=err)
    assert "state at the cut" in err.getvalue()


def test_as_of_reads_after_the_cut_answer_as_before_it(seed, archive_dir, write):
    seeded = seed(4)
    write(seeded.root, f"{NS_A}/doc/late", {"after": "cut"})
    target = seeded.seq_of(9)
    head = LogHead.objects.get().seq
    points = [target + 1, target + 3, head]
    expected = _as_of_everything(points)
    namespace_diff = diff.namespace_diff(
        listing=diff.Listing(namespaces=None, namespace=NS_A), from_seq=target + 1,
        to_seq=head, after=None, limit=100,
    )  # fmt: skip
    cut(target + 1)
    assert _as_of_everything(points) == expected
    assert diff.namespace_diff(
        listing=diff.Listing(namespaces=None, namespace=NS_A), from_seq=target + 1,
        to_seq=head, after=None, limit=100,
    ) == namespace_diff  # fmt: skip


def test_a_second_cut_continues_the_chain_and_the_state(
    seed, archive_dir, write, publish_committed
):
    seeded = seed(3)
    first = seeded.seq_of(4)
    cut(first + 1)
    for n in range(4):
        write(seeded.root, f"{NS_A}/doc/a", {"n": 100 + n})
        write(seeded.root, f"{NS_B}/doc/second{n}", {"n": n})
    write(seeded.root, f"{NS_B}/doc/second0", None)
    publish_committed()
    head = LogHead.objects.get().seq
    second = head - 3
    points = [second + 1, head]
    expected = _as_of_everything(points)
    cut(second + 1)
    assert list(ArchiveCut.objects.order_by("seq").values_list("from_seq", "seq")) == [
        (1, first), (first + 1, second),
    ]  # fmt: skip
    assert _as_of_everything(points) == expected
    report = offline.verify_archive(
        offline.DirectorySource(archive_dir), public_keys=[public_key()]
    )
    assert report.ok, report.problems
    assert report.checkpoints == 2 and report.head_seq == second
    # Only the rows valid at the newest cut are left; they have the digest it signs.
    assert not ArchiveBase.objects.filter(valid_to__lte=second).exists()
    assert base.digest_at(second) == ArchiveCut.objects.get(seq=second).state_digest


def test_offline_verification_finds_a_changed_segment_or_a_forged_signature(seed, archive_dir):
    seeded = seed(2)
    cut(seeded.seq_of(5) + 1)
    source = offline.DirectorySource(archive_dir)
    assert offline.verify_archive(source, public_keys=[public_key()]).ok
    other = signing.public_key_text(signing.load_private_key(signing.new_private_key()))
    assert "signature" in offline.verify_archive(source, public_keys=[other]).problems[0]

    first = sorted((archive_dir / "segments").iterdir())[0]
    with gzip.open(first, "rt") as handle:
        lines = handle.read().splitlines()
    op = json.loads(lines[2])
    op["after"] = {**(op["after"] or {}), "tampered": True}
    lines[2] = json.dumps(op)
    first.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    problems = offline.verify_archive(source, public_keys=[public_key()]).problems
    assert "SHA-256" in problems[0]


def test_a_segment_rewritten_with_its_digest_still_breaks_the_chain(seed, archive_dir):
    """Re-signing with another key is forgery; re-hashing without it is caught by the chain."""
    seeded = seed(2)
    cut(seeded.seq_of(5) + 1)
    done = ArchiveCut.objects.get()
    segment = done.segments.order_by("first_seq").first()
    path = archive_dir / segment.name
    with gzip.open(path, "rt") as handle:
        lines = handle.read().splitlines()
    op = json.loads(lines[2])
    op["slug"] = "renamed"
    lines[2] = json.dumps(op)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    digest, size = segments.file_digest(path.open("rb"))
    forged = {**done.checkpoint}
    forged["segments"] = [
        {**s, "digest": digest, "bytes": size} if s["name"] == segment.name else s
        for s in forged["segments"]
    ]
    forged["signature"] = signing.sign(forged, signing.load_private_key(KEY))
    name = sorted((archive_dir / "checkpoints").iterdir())[0]
    name.write_text(json.dumps(forged))
    problems = offline.verify_archive(offline.DirectorySource(archive_dir)).problems
    assert "chain breaks" in problems[0]


def test_a_dry_run_changes_nothing(seed, archive_dir):
    seeded = seed(2)
    outcome = cut(seeded.seq_of(5) + 1, dry_run=True)
    assert outcome.plan is not None and outcome.plan.seq == seeded.seq_of(5)
    assert not ArchiveCut.objects.exists()
    assert not archive_dir.exists() or not any(archive_dir.rglob("*.gz"))
    assert boundary.current() is None


def test_archive_log_refuses_without_a_signing_key(seed, archive_dir, settings):
    seeded = seed(1)
    settings.ATLAS_ARCHIVE_SIGNING_KEY = ""
    err = StringIO()
    with pytest.raises(SystemExit):
        call_command("archive_log", "--before", str(seeded.seq_of(2)), "--no-progress",
                     stderr=err, stdout=StringIO())  # fmt: skip
    assert "archive_keygen" in err.getvalue()
    assert not ArchiveCut.objects.exists()


def test_archive_log_by_time_and_its_report(seed, archive_dir):
    seeded = seed(2)
    sixth = Changeset.objects.get(seq=seeded.seq_of(5) + 1)
    out = StringIO()
    stamp = sixth.at.isoformat().replace("+00:00", "Z")
    call_command("archive_log", "--before", stamp, "--no-progress", stdout=out)
    boundary.forget()
    assert f"cut through seq {sixth.seq - 1}" in out.getvalue()
    assert not Changeset.objects.filter(seq__lt=sixth.seq).exists()
    assert Changeset.objects.filter(pk=sixth.pk).exists()


def test_the_export_format_is_what_the_segments_hold(seed, archive_dir):
    """A segment's envelope and op lines parse as an export file once the chain is dropped."""
    seeded = seed(1)
    cut(seeded.seq_of(2) + 1)
    lines = _segment_lines(archive_dir)[1:]
    text = "\n".join(_without_chain(line) for line in lines[: 1 + lines[0]["chain"]["op_count"]])
    parsed = ndjson.parse(text)
    assert parsed.envelope["changeset_id"] == lines[0]["changeset_id"]
    assert [op.key for op in parsed.ops] == [EntityKey(o["namespace"], o["kind"], o["slug"])
                                             for o in lines[1 : 1 + len(parsed.ops)]]  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_one_archiver_at_a_time(seed, archive_dir):
    """A second archiver (another archive_log, the retention task) finds the lock taken."""
    seeded = seed(1)
    with psycopg.connect(database_url_of_tests(), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [locks.ARCHIVER_LOCK])
        with pytest.raises(locks.Busy):
            cut(seeded.seq_of(2) + 1)
    assert not ArchiveCut.objects.exists()
    cut(seeded.seq_of(2) + 1)  # free again
    assert ArchiveCut.objects.get().state == CutState.REMOVED


@pytest.mark.django_db(transaction=True)
def test_a_cut_made_while_hashes_were_hex_text_verifies_after_0027_and_is_continued(
    seed, archive_dir
):
    """Checkpoints and segments hold hashes as hex, before migration 0027 and after it:
    the hot log chains on from a checkpoint made while the columns held hex text, and a
    cut made after continues it (one chain, offline and online)."""
    seeded = seed(3)
    first = seeded.seq_of(5)
    cut(first + 1)
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    try:
        MigrationExecutor(connection).migrate([("changesets", "0026_journal_published_gone")])
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_typeof(prev_hash)::text, prev_hash FROM changesets_changeset"
                " ORDER BY seq LIMIT 1"
            )
            assert cursor.fetchone() == ("character varying", ArchiveCut.objects.get().hash)
    finally:
        MigrationExecutor(connection).migrate(latest)
    out = StringIO()
    call_command("verify_log", "--no-progress", stdout=out)
    assert f"checkpoint: seq {first}" in out.getvalue()

    second = seeded.seq_of(11)
    [done] = cut(second + 1).cuts
    assert done.prev_hash == ArchiveCut.objects.get(seq=first).hash
    report = offline.verify_archive(
        offline.DirectorySource(archive_dir), public_keys=[public_key()]
    )
    assert report.ok, report.problems
    assert (report.head_seq, report.head_hash) == (second, done.hash)
    call_command("verify_log", "--no-progress", stdout=StringIO())
