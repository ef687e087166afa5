"""The one write path: apply an ordered op list to a store as one changeset.

Every entry point (PUT/PATCH/DELETE, batch, delete-by-query, revert, import
and merge) calls :func:`changeset_apply`, which is what makes every entity's
history complete (DESIGN invariant 1). Its steps live where they read best:
locking and authorizing in ``lock``, the in-memory rules in ``netchange``, the
log statement in ``log_statement``, retries in ``retry``; the attempt and the
writing here. ``_may_write_unlocked``, ``_write_log`` and ``_read_versions`` are
looked up in this module's namespace on every write, so tests and the
reliability harness may wrap them here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast
from uuid import UUID

import uuid6
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from atlas import replicas
from atlas.db import prepared_cursor
from changesets import chain
from changesets.fields import to_hex
from changesets.hooks import run_write_hooks
from changesets.models import BASELINE, Changeset, Rpc
from changesets.ops import WriteOp, op_repr
from changesets.services import lock, log_statement, netchange
from changesets.services.lock import (
    Planner,
    check_op_limit,
    confirm_plan,
    lock_rows,
    planned_ops,
)
from changesets.services.netchange import Folded, NetChange
from changesets.services.result import ApplyResult, PlannedResult
from changesets.services.retry import HeadMissing, attempts
from changesets.services.retry import may_write_unlocked as _may_write_unlocked
from entities.store import (
    EntityKey,
    EntityStore,
    KeyRaced,
    OptimisticStore,
    StoredEntity,
    WriteSql,
)

__all__ = [
    "ApplyResult",
    "PlannedResult",
    "Planner",
    "changeset_apply",
    "changeset_apply_planned",
    "changeset_apply_within",
    "check_op_limit",
]

# (metadata, context): carried unread from changeset_apply to the changeset row.
Provenance = tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]


def changeset_apply(
    *,
    store: EntityStore,
    actor: User,
    ops: Sequence[WriteOp] = (),
    rpc: Rpc | str,
    comment: str = "",
    dry_run: bool = False,
    check_permissions: bool = True,
    plan: Planner | None = None,
    keys: Sequence[EntityKey] = (),
    metadata: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
    expect_plan: str | None = None,
) -> ApplyResult:
    """Apply ``ops`` in order as one changeset on ``store``, in one transaction.

    Instead of ``ops``, a caller that must decide its ops from the current
    state (revert, merge) passes ``keys`` and ``plan``: ``plan`` is called with
    the locked rows of ``keys`` (absent keys missing from the mapping) inside
    the transaction, and returns the ops, or raises to refuse. Deciding under
    the lock is what makes "nothing moved since" checks race-free.

    Why it is shaped this way:

    1. Existing rows are locked (``FOR UPDATE``, in key order) before any
       precondition is read, so If-Match can never lose an update. A write of
       one key outside any transaction reads it unlocked instead and writes it
       compare-and-set, committing in its log statement; a row that moved in
       between sends it back here, locked (:func:`_may_write_unlocked`).
    2. Ops run in memory against that locked state; later ops see earlier
       ones. Each key folds to one net change: first ``before``, last ``after``
       (invariant 4). A key whose net change is nothing writes nothing.
    3. Nothing moved, or a dry run: return without a changeset (invariant 3).
    4. One statement (:func:`_write_log`) writes the entity rows set-based,
       then draws ``seq`` by updating the one-row log head, whose lock is
       held to commit, so seq order is commit order (invariant 6); the same
       update computes the chain hash (``changesets.chain``), and the
       statement inserts the changeset (with ``metadata`` and ``context``:
       ``changesets.provenance``; no context is a system write), its revisions
       and its journal entry. Every store's writes ride in it
       (``EntityStore.write_sql``). The write hooks run after it, in the transaction.
    5. Not ``durable``: a host project may call it inside its own transaction
       (its row and the changeset commit together, docs/embedding.md). Each
       attempt is then a savepoint, so a retry still starts clean; the log
       head's lock is held until the caller's COMMIT, which keeps seq order
       commit order but makes every other writer wait for the rest of that
       transaction, so callers keep it short. Atlas's own callers run it
       outside any transaction.

    ``expect_plan`` (a :func:`~changesets.services.plans.plan_digest` a dry run
    reported as ``ApplyResult.plan``) confirms a previewed write: between steps
    2 and 4, under the locks, a write whose net changes have another digest is
    refused with :class:`PlanChanged` and writes nothing.
    """
    if plan is None:
        check_op_limit(len(ops))
    once = functools.partial(
        _apply_once,
        store=store,
        actor=actor,
        ops=ops,
        plan=plan,
        plan_keys=keys,
        rpc=str(rpc),
        comment=comment,
        dry_run=dry_run,
        check_permissions=check_permissions,
        provenance=(metadata, context),
        expect_plan=expect_plan,
    )
    return attempts(once, unlocked_first=_may_write_unlocked(store, ops, plan))


def changeset_apply_planned(
    *,
    store: EntityStore,
    actor: User,
    rpc: Rpc | str,
    keys: Sequence[EntityKey],
    plan: Planner,
    comment: str = "",
    dry_run: bool = False,
    check_permissions: bool = True,
    metadata: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
    expect_plan: str | None = None,
) -> PlannedResult:
    """:func:`changeset_apply` with ``plan``, reporting the ops the plan chose."""
    planned: list[WriteOp] = []

    def recording(current: Mapping[EntityKey, StoredEntity]) -> Sequence[WriteOp]:
        planned[:] = plan(current)
        return planned

    result = changeset_apply(
        store=store,
        actor=actor,
        rpc=rpc,
        comment=comment,
        dry_run=dry_run,
        keys=keys,
        plan=recording,
        check_permissions=check_permissions,
        metadata=metadata,
        context=context,
        expect_plan=expect_plan,
    )
    return PlannedResult(result.changeset, [op_repr(op) for op in planned], dry_run, result)


def changeset_apply_within(
    *,
    store: EntityStore,
    actor: User,
    rpc: Rpc | str,
    keys: Sequence[EntityKey],
    plan: Planner,
    comment: str = "",
    dry_run: bool = False,
    context: Mapping[str, Any] | None = None,
) -> ApplyResult:
    """One attempt of :func:`changeset_apply` with ``plan``, inside the caller's transaction.

    For a service whose changeset must commit together with other work (an
    erasure writes its ``EraseEntity`` changesets and redacts the log in one
    transaction). The caller has authorized the write, owns the transaction
    and retries it whole: a lost race or a deadlock propagates from here.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("changeset_apply_within() needs the caller's transaction")
    with transaction.atomic():
        return _apply_once(
            store=store,
            actor=actor,
            ops=(),
            plan=plan,
            plan_keys=keys,
            rpc=str(rpc),
            comment=comment,
            dry_run=dry_run,
            check_permissions=False,
            provenance=(None, context),
        )


def _apply_once(
    *,
    store: EntityStore,
    actor: User,
    ops: Sequence[WriteOp],
    plan: Planner | None,
    plan_keys: Sequence[EntityKey],
    rpc: str,
    comment: str,
    dry_run: bool,
    check_permissions: bool,
    provenance: Provenance,
    expect_plan: str | None = None,
    unlocked: bool = False,
) -> ApplyResult:
    """One attempt of :func:`changeset_apply`, inside its transaction, step by step;
    ``unlocked`` (:func:`_may_write_unlocked`), outside any: step 1 reads without
    locking and step 4 writes compare-and-set, committing as it ends."""
    branch = store.branch
    touched = [(k, None) for k in plan_keys] if plan else [(op.key, op.pointer) for op in ops]
    keys = list(dict.fromkeys(k for k, _ in touched))  # first-touch order
    initial = lock_rows(  # 1
        store, actor, touched, keys, check_permissions=check_permissions, for_update=not unlocked
    )
    if plan is not None:
        ops = planned_ops(plan, initial, keys)
    missing = [k for k in keys if k not in initial]
    last_versions = lock.last_versions(branch, missing) if missing else {}
    base, state = netchange.initial_states(keys, initial)
    results = netchange.run_ops(ops, state, initial=initial, last_versions=last_versions)  # 2
    folded = netchange.fold(keys, base, state)
    results = netchange.unmoved_results(ops, results, folded.unmoved, initial)
    if expect_plan is not None:
        confirm_plan(expect_plan, branch, folded)
    changeset, now = None, timezone.now()
    changed: list[list[str]] = []
    if folded.changes and not dry_run:  # 3: otherwise no changeset
        changeset, now, changed = _record(
            store=store,
            actor=actor,
            rpc=rpc,
            comment=comment,
            folded=folded,
            provenance=provenance,
            read_at=_read_versions(initial) if unlocked else None,
        )
    return ApplyResult(
        changeset=changeset,
        results=results,
        entities=netchange.final_entities(
            initial, state, keys, folded.unmoved, changeset.id if changeset else None, now
        ),
        dry_run=dry_run,
        changes=folded.changes,
        branch=branch,
        changed=changed,
    )


def _record(
    *,
    store: EntityStore,
    actor: User,
    rpc: str,
    comment: str,
    folded: Folded,
    provenance: Provenance,
    read_at: Mapping[EntityKey, int] | None = None,
) -> tuple[Changeset, datetime, list[list[str]]]:
    """Step 4: the store's rows and the log in one statement, then the write hooks.
    Returns it, its clock reading and its revisions' changed keys (in change order).

    ``read_at`` (an unlocked write's: the versions its rows were read at) makes the
    store's writes compare-and-set and the statement a checked one.
    """
    changes, branch = folded.changes, store.branch
    if read_at is not None:  # commits as it ends, outside any transaction the router sees
        replicas.wrote()
    changeset_id: UUID = uuid6.uuid7()
    now = log_statement.log_clock()
    write_sql = (
        store.write_sql
        if read_at is None
        else functools.partial(cast(OptimisticStore, store).write_sql, expect=read_at)
    )
    entity_sql = write_sql(
        changeset_id=changeset_id,
        now=now,
        creates=folded.creates,
        updates=folded.updates,
        deletes=folded.deletes,
    )
    metadata, context = provenance
    changeset = log_statement.new_changeset(
        changeset_id,
        actor=actor,
        rpc=rpc,
        comment=comment,
        branch=branch,
        changes=changes,
        metadata=metadata,
        context=context,
    )
    salts = [chain.new_salt() for _ in changes]
    changed = _write_log(
        changeset,
        changes,
        now=now,
        salts=salts,
        revisions_hex=log_statement.revisions_digest(changes, branch, salts),
        journal=branch == BASELINE,
        entity_sql=entity_sql,
        checked=read_at is not None,
    )
    # From here to COMMIT this transaction holds the log head's lock: keep it short.
    run_write_hooks(changeset)
    # Post-commit work needs nothing from here: the journal row (_write_log) notifies
    # the relay at COMMIT (changesets.outbox.relay).
    return changeset, now, changed


def _write_log(
    changeset: Changeset,
    changes: Sequence[NetChange],
    *,
    now: datetime,
    revisions_hex: str,
    salts: Sequence[bytes],
    journal: bool,
    entity_sql: WriteSql,
    checked: bool = False,
) -> list[list[str]]:
    """Run the log statement (``log_statement``: the store's rows, then seq, the
    changeset, its revisions and, on baseline, its journal entry); set ``seq``,
    ``at`` and ``hash`` on ``changeset``; return the revisions'
    ``changed`` pointers, in change order.

    A create that lost a race inserted nothing: the head is not moved, nothing
    is logged, and :class:`KeyRaced` retries the whole write. (Tests wrap this
    function to pause between drawing seq and COMMIT.) A ``checked`` statement
    (an unlocked write's) raises a serialization failure instead.
    """
    sql = log_statement.statement(entity_sql, journal=journal, checked=checked)
    values = log_statement.params(
        changeset,
        changes,
        now=now,
        revisions_hex=revisions_hex,
        salts=salts,
        entity_sql=entity_sql,
        writes=len(changes) if checked else None,
    )
    with prepared_cursor() as cursor:
        cursor.execute(sql, values)
        row = cursor.fetchone()
    if row is None or row[0] is None:
        # The head did not move: a create lost its race (fewer rows inserted than
        # meant), or else the head's row is gone.
        if row is not None and row[3] != entity_sql.creates:
            raise KeyRaced()
        raise HeadMissing()
    changeset.seq, changeset.at = row[:2]
    # Stored as bytes; hex text from here on, as the model reads it (``changesets.fields``).
    # No prev_hash, as the row has none (migration 0034): it is the previous row's hash.
    changeset.hash = to_hex(row[2])
    return json.loads(row[4])


def _read_versions(initial: Mapping[EntityKey, StoredEntity]) -> dict[EntityKey, int]:
    """The version each existing row was read at: what an unlocked write's
    compare-and-set expects to find."""
    return {key: entity.version for key, entity in initial.items()}
