"""Writers go on while a cut is made: real concurrent transactions, latencies measured.

Three writer threads commit changesets through the write service for the
whole of an archive cut (segments, verification, signature, switch, batched
removal) made in this thread. Every write must commit, the chain must verify
across the cut and the new writes, and the archive offline. The writers'
latencies are measured and printed (``-s``): asserting a time would make the
test fail on a busy machine, so the 100 ms bound is asserted only under
``ATLAS_STRESS=1`` (and ``bench/archive.py`` records the figures).
"""

from __future__ import annotations

import os
import threading
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from changesets.archive import archiver, boundary, offline
from changesets.models import Changeset, Rpc
from changesets.ops import PutOp
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.changesets.archive.conftest import NS_A, NS_B, public_key
from tests.changesets.partition_helpers import layout

pytestmark = pytest.mark.django_db(transaction=True)


def _writer(actor, index: int, stop: threading.Event, latencies: list[float], errors: list) -> None:
    n = 0
    try:
        while not stop.is_set():
            key = EntityKey(NS_B, "live", f"w{index}-{n % 20}")
            started = time.perf_counter()
            changeset_apply(store=baseline, actor=actor, ops=[PutOp(key, {"n": n})],
                            rpc=Rpc.PUT_ENTITY)  # fmt: skip
            latencies.append(time.perf_counter() - started)
            n += 1
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)
    finally:
        connection.close()


def test_writers_are_not_blocked_while_a_cut_is_made(
    make_user, archive_dir, settings, publish_committed, capsys
):
    settings.ATLAS_ARCHIVE_SEGMENT_REVISIONS = 200
    settings.ATLAS_ARCHIVE_DELETE_BATCH = 50
    layout([(0, 151), (151, 100_000)])  # the cut at 150 drops one partition
    root = make_user("root", superuser=True)
    make_user("maker", maintainer=[NS_A, NS_B])
    for n in range(150):
        ops = [
            PutOp(EntityKey(NS_A, "doc", f"k{(n * 3 + i) % 40}"), {"n": n, "i": i})
            for i in range(3)
        ]
        changeset_apply(store=baseline, actor=root, ops=ops, rpc=Rpc.BATCH_MUTATE)
    publish_committed()
    cut_at = Changeset.objects.order_by("-seq").values_list("seq", flat=True).first()

    stop, errors = threading.Event(), []
    latencies: list[list[float]] = [[] for _ in range(3)]
    threads = [
        threading.Thread(target=_writer, args=(root, i, stop, latencies[i], errors))
        for i in range(3)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # the writers are running before the cut begins
    started = time.perf_counter()
    outcome = archiver.archive(before=cut_at + 1, requested_by="test")
    elapsed = time.perf_counter() - started
    time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    boundary.forget()

    assert not errors, errors
    assert [c.seq for c in outcome.cuts] == [cut_at]
    assert not Changeset.objects.filter(seq__lte=cut_at).exists()
    writes = sorted(x for per in latencies for x in per)
    assert len(writes) > 30
    call_command("verify_log", "--no-progress", stdout=StringIO())
    assert offline.verify_archive(
        offline.DirectorySource(archive_dir), public_keys=[public_key()]
    ).ok
    worst, p99 = writes[-1] * 1000, writes[int(len(writes) * 0.99)] * 1000
    with capsys.disabled():
        print(
            f"\n[archive concurrency] cut of {cut_at} changesets in {elapsed:.2f}s;"
            f" {len(writes)} concurrent writes: p50 {writes[len(writes) // 2] * 1000:.1f} ms,"
            f" p99 {p99:.1f} ms, max {worst:.1f} ms"
        )
    if os.environ.get("ATLAS_STRESS") == "1":
        assert worst < 100, f"a writer waited {worst:.0f} ms during the cut"
