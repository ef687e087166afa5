"""The unlocked single write: read, then one statement that writes and commits.

A single-entity write outside any transaction reads its row without a lock and
writes it back compare-and-set in the log statement, which commits as it ends
(``changesets.services.apply._may_write_unlocked``; issue 17). A row that moved
in between must never be overwritten from the stale read: the statement fails
with a serialization failure, writes nothing, and the service retries the write
locked, judging its ops against the row as it now is.

Each race is forced, not left to timing: the store's read, the first time it
runs unlocked, lets another thread write the same key and commit before the
read returns.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext

from atlas.exceptions import NotFound, PreconditionFailed
from changesets.hooks import in_write_transaction
from changesets.models import Changeset, Revision, Rpc
from changesets.ops import DeleteOp, PatchOp, PutOp, WriteOp
from changesets.services import apply as services
from changesets.services import retry
from changesets.services.apply import changeset_apply
from entities.store import BaselineStore, EntityKey, baseline
from tests.atlas.test_errors import assert_problem
from tests.changesets.test_concurrency import assert_no_errors, run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)

NS = "acme.orders"
A = EntityKey(NS, "order", "a")
B = EntityKey(NS, "order", "b")


def apply(actor: Any, *ops: WriteOp) -> Any:
    return changeset_apply(store=baseline, actor=actor, ops=list(ops), rpc=Rpc.BATCH_MUTATE)


@pytest.fixture
def race(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[bool]]:
    """``race(actor, op)``: the next unlocked read is followed, before it returns,
    by ``op`` written and committed by another thread. Returns the lock calls'
    ``for_update`` flags from then on, one per call, as they happen."""
    calls: list[bool] = []
    pending: list[tuple[Any, WriteOp]] = []
    real_lock = BaselineStore.lock

    def lock(self: Any, keys: Any, **kw: Any) -> Any:
        out = real_lock(self, keys, **kw)
        calls.append(kw.get("for_update", True))
        if not kw.get("for_update", True) and pending:
            actor, op = pending.pop()
            assert_no_errors(run_in_threads(lambda: apply(actor, op)))
        return out

    monkeypatch.setattr(BaselineStore, "lock", lock)

    def arm(actor: Any, op: WriteOp) -> list[bool]:
        calls.clear()
        pending.append((actor, op))
        return calls

    return arm


def versions(key: EntityKey) -> list[tuple[int | None, int | None]]:
    rows = Revision.objects.filter(namespace=key.namespace, slug=key.slug).order_by("seq")
    return [(r.before_version, r.after_version) for r in rows]


def log_verifies() -> None:
    seqs = list(Changeset.objects.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # the failed try drew no seq
    out = io.StringIO()
    call_command("verify_log", "--no-progress", stdout=out)
    assert "verified" in out.getvalue()


def test_a_patch_racing_a_write_loses_no_update(writer, race):
    apply(writer, PutOp(A, {"n": 0}))
    calls = race(writer, PatchOp(A, {"theirs": 1}))
    result = apply(writer, PatchOp(A, {"ours": 1}))
    # Ours read unlocked; theirs (unlocked too) landed meanwhile; ours, refused,
    # read again locked.
    assert calls == [False, False, True]
    entity = baseline.get(A)
    assert entity is not None
    assert entity.content == {"n": 0, "theirs": 1, "ours": 1}
    assert entity.version == 3 and result.changeset is not None
    assert versions(A) == [(None, 1), (1, 2), (2, 3)]
    [revision] = result.revisions
    assert revision.before == {"n": 0, "theirs": 1}
    log_verifies()


def test_if_match_judges_the_row_as_it_is_after_a_race(writer, race):
    apply(writer, PutOp(A, {"n": 0}))
    race(writer, PatchOp(A, {"n": 1}))
    with pytest.raises(PreconditionFailed):
        apply(writer, PutOp(A, {"n": 2}, if_match=1))
    entity = baseline.get(A)
    assert entity is not None and entity.content == {"n": 1} and entity.version == 2
    assert versions(A) == [(None, 1), (1, 2)]
    log_verifies()


def test_a_row_deleted_after_the_read_is_not_patched(writer, race):
    apply(writer, PutOp(A, {"n": 0}))
    race(writer, DeleteOp(A))
    with pytest.raises(NotFound):
        apply(writer, PatchOp(A, {"n": 1}))
    assert baseline.get(A) is None
    assert versions(A) == [(None, 1), (1, None)]
    log_verifies()


def test_a_create_racing_a_create_updates_the_winner(writer, race):
    race(writer, PutOp(A, {"theirs": 1}))
    result = apply(writer, PutOp(A, {"ours": 1}))
    entity = baseline.get(A)
    assert entity is not None and entity.content == {"ours": 1} and entity.version == 2
    [revision] = result.revisions
    assert revision.before == {"theirs": 1}
    assert versions(A) == [(None, 1), (1, 2)]
    log_verifies()


def test_a_delete_racing_a_write_deletes_what_the_row_became(writer, race):
    apply(writer, PutOp(A, {"n": 0}))
    race(writer, PatchOp(A, {"n": 1}))
    result = apply(writer, DeleteOp(A))
    [revision] = result.revisions
    assert revision.before == {"n": 1} and revision.before_version == 2
    assert baseline.get(A) is None
    log_verifies()


@pytest.mark.parametrize(
    "where",
    [
        "single, no transaction",
        "batch of two keys",
        "caller's transaction",
        "transaction by hand",
        "write hook",
    ],
)
def test_which_writes_read_unlocked(writer, where):
    apply(writer, PutOp(A, {"n": 0}), PutOp(B, {"n": 0}))
    ops: list[WriteOp] = [PutOp(A, {"n": 1})]
    if where == "batch of two keys":
        ops.append(PutOp(B, {"n": 1}))
    with CaptureQueriesContext(connection) as captured:
        if where == "caller's transaction":
            with transaction.atomic():
                apply(writer, *ops)
        elif where == "transaction by hand":
            transaction.set_autocommit(False)
            try:
                apply(writer, *ops)
                transaction.commit()
            finally:
                transaction.set_autocommit(True)
        elif where == "write hook":
            with in_write_transaction(lambda changeset: None):
                apply(writer, *ops)
        else:
            apply(writer, *ops)
    [read] = [q["sql"] for q in captured.captured_queries if "FROM entities_entity e" in q["sql"]]
    assert ("FOR UPDATE" not in read) is (where == "single, no transaction")
    [log] = [q["sql"] for q in captured.captured_queries if "changesets_loghead" in q["sql"]]
    assert ("atlas_write_moved" in log) is (where == "single, no transaction")


def test_the_checked_statement_writes_nothing_when_the_row_moved(writer):
    """The statement itself, given a stale expectation: it raises and leaves the
    entity, the head and the log as they were (the rows it wrote go with it)."""
    apply(writer, PutOp(A, {"n": 0}))
    apply(writer, PatchOp(A, {"n": 1}))
    head = Changeset.objects.order_by("-seq").first()
    stale = {A: 1}  # the row is at version 2
    real = services._read_versions

    def read_versions(initial: Any) -> dict[EntityKey, int]:
        real(initial)
        return stale

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(services, "_read_versions", read_versions)
        mp.setattr(retry, "MAX_ATTEMPTS", 1)
        with pytest.raises(OperationalError) as caught:
            apply(writer, PatchOp(A, {"n": 2}))
    assert getattr(caught.value.__cause__, "sqlstate", None) == "40001"
    entity = baseline.get(A)
    assert entity is not None and entity.content == {"n": 1} and entity.version == 2
    assert Changeset.objects.order_by("-seq").first() == head
    log_verifies()


def test_over_http_a_put_racing_a_write_answers_412_and_an_unconditional_one_lands(
    writer, race, client_for
):
    """The API's single writes take the unlocked path (no Idempotency-Key): a race is
    judged against the row as it now is, and the answer says so."""
    client = client_for(writer)
    url = f"/api/v1/entities/{NS}/order/a"
    assert client.put(url, {"content": {"n": 0}}, format="json").status_code == 201
    calls = race(writer, PatchOp(A, {"n": 1}))
    response = client.put(url, {"content": {"n": 2}}, format="json", HTTP_IF_MATCH='"1"')
    assert calls == [False, False, True]  # read unlocked; theirs; ours again, locked
    body = assert_problem(response, 412)
    assert "version 2" in body["detail"]
    race(writer, PatchOp(A, {"n": 3}))
    response = client.put(url, {"content": {"n": 4}}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["entity"]["version"] == 4
    assert versions(A) == [(None, 1), (1, 2), (2, 3), (3, 4)]
    log_verifies()
