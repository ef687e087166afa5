"""The feed never skips a committed changeset: a reader tails it while writers commit.

Real commits (``transaction=True``): 8 writer threads, each with its own
connection, commit 2,000+ changesets (some of several revisions) while one
reader follows ``GET /changes`` over the HTTP API with small pages. The reader
must end with every baseline changeset exactly once, all its records
together, in strictly increasing seq order.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from django.db import connection

from changesets.models import BASELINE, Changeset, Rpc
from changesets.ops import PutOp
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline

pytestmark = pytest.mark.django_db(transaction=True)

NS = "acme.orders"
WRITERS = 8
PER_WRITER = 260  # 2,080 changesets
READER_LIMIT = 37


def test_reader_tailing_the_feed_sees_every_changeset_exactly_once_in_seq_order(
    staff, namespace, client_for, monkeypatch
):
    client = client_for(staff)
    writers_done = threading.Event()
    errors: list[BaseException] = []
    pages_while_writing = [0]
    records: list[dict[str, Any]] = []

    def writer(n: int) -> None:
        try:
            for i in range(PER_WRITER):
                width = 1 + (i % 3)  # 1, 2 or 3 revisions: pages must not split them
                ops = [
                    PutOp(EntityKey(NS, "item", f"w{n}-{i}-{j}"), {"w": n, "i": i, "j": j})
                    for j in range(width)
                ]
                changeset_apply(store=baseline, actor=staff, ops=ops, rpc=Rpc.BATCH_MUTATE)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    def reader() -> None:
        cursor = None
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                done = writers_done.is_set()  # read before the page: then empty means caught up
                params: dict[str, Any] = {"limit": READER_LIMIT}
                if cursor is not None:
                    params["since"] = cursor
                response = client.get("/api/v1/changes", params)
                assert response.status_code == 200, response.content
                page = response.json()
                records.extend(page["records"])
                if page["records"] and not done:
                    pages_while_writing[0] += 1
                cursor = page["next_cursor"]
                if done and not page["records"]:
                    return
            raise AssertionError("the reader did not catch up in time")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    tail = threading.Thread(target=reader)
    tail.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    writers_done.set()
    tail.join(120)
    assert not tail.is_alive() and not any(t.is_alive() for t in threads)
    assert not errors, errors

    committed = list(
        Changeset.objects.filter(branch=BASELINE)
        .order_by("seq")
        .values_list("id", "seq", "op_count")
    )
    assert len(committed) == WRITERS * PER_WRITER

    # Group the records as read: a changeset's records must be contiguous.
    groups: list[tuple[str, int, int]] = []
    for record in records:
        if groups and groups[-1][0] == record["changeset_id"]:
            cid, seq, n = groups[-1]
            assert record["seq"] == seq
            groups[-1] = (cid, seq, n + 1)
        else:
            groups.append((record["changeset_id"], record["seq"], 1))
    seen = Counter(cid for cid, _, _ in groups)
    assert [cid for cid, n in seen.items() if n > 1] == [], "a changeset was read twice or split"
    assert [seq for _, seq, _ in groups] == sorted({seq for _, seq, _ in groups}), (
        "seqs must strictly increase"
    )
    assert [(cid, seq, n) for cid, seq, n in groups] == [
        (str(cid), seq, n) for cid, seq, n in committed
    ], "every committed changeset exactly once, whole, in seq order"
    assert pages_while_writing[0] >= 10, "the reader should have tailed while writers wrote"
