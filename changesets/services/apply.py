"""The one write path: apply an ordered op list to a store as one changeset.

Every entry point (PUT/PATCH/DELETE, batch, delete-by-query, revert, import
and merge) calls :func:`changeset_apply`, which is what makes every entity's
history complete (DESIGN invariant 1). Its steps live where they read best:
the in-memory rules in ``netchange``, the log statement in ``log_statement``,
the locking and the writing here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast
from uuid import UUID

import uuid6
from django.contrib.auth.models import User
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from atlas import conf, replicas
from atlas.db import prepared_cursor
from atlas.exceptions import NotFound
from changesets import chain
from changesets.exceptions import PlanChanged, TooManyOps
from changesets.fields import to_hex
from changesets.hooks import has_write_hooks, run_write_hooks
from changesets.models import BASELINE, Changeset, LogHead, Rpc
from changesets.ops import WriteOp, op_repr
from changesets.services import log_statement, netchange
from changesets.services.netchange import Folded, NetChange
from changesets.services.plans import plan_digest
from changesets.services.result import ApplyResult, PlannedResult
from entities import access
from entities.models import Namespace
from entities.store import (
    EntityKey,
    EntityStore,
    KeyRaced,
    OptimisticStore,
    StoredEntity,
    WriteSql,
)

MAX_ATTEMPTS = 5
# PostgreSQL's codes for "try the whole transaction again".
RETRYABLE_SQLSTATES = {"40P01", "40001"}

Planner = Callable[[Mapping[EntityKey, StoredEntity]], Sequence[WriteOp]]
# (metadata, context): carried unread from changeset_apply to the changeset row.
Provenance = tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]


def check_op_limit(count: int, *, what: str = "") -> None:
    """Refuse a changeset of more than ``ATLAS_MAX_BATCH_OPS`` ops (413, :class:`TooManyOps`).

    The one rule behind API.md's "no changeset, from any path, has more than
    ``ATLAS_MAX_BATCH_OPS`` ops". :func:`changeset_apply` calls it for every
    write, dry runs included: on the given ops before any row is locked, on a
    plan's ops as soon as the plan returns (before anything is written). It
    counts ops, not net changes: a changeset's revisions are at most its ops,
    so the bound holds for the changeset, and a request is refused the same
    way whatever state it meets. A caller that knows its count before calling
    (an import file) may call it first to refuse without locking anything;
    ``what`` names the request in the detail ("Merging branch 'x'").
    """
    limit = conf.get("ATLAS_MAX_BATCH_OPS")
    if count > limit:
        raise TooManyOps(count, limit, what=what)


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
    return _attempts(once, unlocked_first=_may_write_unlocked(store, ops, plan))


def _attempts(once: Callable[..., ApplyResult], *, unlocked_first: bool) -> ApplyResult:
    """Run ``once`` until it returns, retrying what :func:`_worth_retrying` allows.

    A retry is always locked: a row that moved once under an unlocked write may
    be busy, and a locked write cannot lose to it again.
    """
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            if attempt == 1 and unlocked_first:
                return once(unlocked=True)
            with transaction.atomic():
                return once(unlocked=False)
        except (KeyRaced, _HeadMissing, OperationalError) as exc:
            if not _worth_retrying(exc) or attempt == MAX_ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _may_write_unlocked(store: EntityStore, ops: Sequence[WriteOp], plan: Planner | None) -> bool:
    """Whether this write may take the one-round-trip path: read unlocked, then
    write compare-and-set in one autocommit statement that commits as it ends.

    Only a write of one key (two writes of one row each cannot deadlock on each
    other's rows; a batch's rows are locked in key order instead), with its ops
    given (a plan decides under the locks), outside any transaction (the
    caller's transaction must hold what the write locks until its COMMIT), with
    no write hooks (they run between the log statement and COMMIT), on a store
    that supports it (``EntityStore`` ``optimistic``).
    """
    return (
        plan is None
        and getattr(store, "optimistic", False)
        and not connection.in_atomic_block
        and connection.get_autocommit()  # no transaction managed by hand either
        and not has_write_hooks()
        and len({op.key for op in ops}) == 1
    )


def _worth_retrying(exc: Exception) -> bool:
    """A lost create race, a deadlock or serialization failure: the whole write
    again; the retry sees the winner's row and judges its preconditions against
    it. A missing log head: recreate it first (the migration creates the row;
    a transactional test's flush removes it)."""
    if isinstance(exc, _HeadMissing):
        LogHead.objects.get_or_create(id=1)
        return True
    if isinstance(exc, OperationalError):
        sqlstate = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
        return sqlstate in RETRYABLE_SQLSTATES
    return True


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
    initial = _lock(  # 1
        store, actor, touched, keys, check_permissions=check_permissions, for_update=not unlocked
    )
    if plan is not None:
        ops = _planned_ops(plan, initial, keys)
    missing = [k for k in keys if k not in initial]
    last_versions = _last_versions(branch, missing) if missing else {}
    base, state = netchange.initial_states(keys, initial)
    results = netchange.run_ops(ops, state, initial=initial, last_versions=last_versions)  # 2
    folded = netchange.fold(keys, base, state)
    results = netchange.unmoved_results(ops, results, folded.unmoved, initial)
    if expect_plan is not None:
        _confirm_plan(expect_plan, branch, folded)
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


def _lock(
    store: EntityStore,
    actor: User,
    touched: Sequence[tuple[EntityKey, str | None]],
    keys: Sequence[EntityKey],
    *,
    check_permissions: bool,
    for_update: bool = True,
) -> dict[EntityKey, StoredEntity]:
    """Step 1: lock the keys' existing rows; refuse a missing namespace (404) or
    a role the actor lacks (403).

    Namespaces must exist (staff create them) and be writable by the actor.
    The store reads them in its lock statement, locking rows only where the
    guard says the actor may write, so a refused caller never holds a lock.
    An actor whose roles are not loaded yet (a request's user) gets a pending
    guard: the lock statement reads its role rows in those namespaces too and
    the check below decides from them, at no round trip (``entities.access.WriteGuard``).
    Without ``for_update`` (an unlocked write) the statement locks nothing.
    """
    first_pointer: dict[str, str | None] = {}
    for key, pointer in touched:
        first_pointer.setdefault(key.namespace, pointer)
    guard = access.write_guard(actor, branch=store.branch) if check_permissions else None
    if for_update:
        initial, existing = store.lock(keys, guard=guard)
    else:
        initial, existing = cast(OptimisticStore, store).lock(keys, guard=guard, for_update=False)
    for name, pointer in first_pointer.items():
        if name not in existing:
            raise NotFound(f"Namespace {name!r} not found.", pointer=pointer)
    if check_permissions:
        namespaces = {  # in name order: the order the checks ran in before
            name: Namespace.from_db(connection.alias, ["name", "protected"], (name, existing[name]))
            for name in sorted(existing)
        }
        roles = guard.learned_roles() if guard is not None else None
        access.require_write(
            actor, namespaces, branch=store.branch, pointers=first_pointer, roles=roles
        )
    return initial


def _confirm_plan(expect_plan: str, branch: str, folded: Folded) -> None:
    """Refuse (:class:`PlanChanged`) a write whose net changes are not the previewed plan."""
    if plan_digest(branch=branch, changes=folded.changes) != expect_plan:
        raise PlanChanged(
            "What this write would record is not the plan it confirms: the entities"
            " changed since the dry run. Nothing was written; dry-run again."
        )


def _planned_ops(
    plan: Planner, initial: Mapping[EntityKey, StoredEntity], keys: Sequence[EntityKey]
) -> list[WriteOp]:
    """A plan's ops, decided under the locks; counted against the op limit at once."""
    ops = list(plan(initial))
    check_op_limit(len(ops))
    stray = {op.key for op in ops} - set(keys)
    if stray:
        raise AssertionError(f"plan touched keys it did not lock: {sorted(stray)}")
    return ops


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
    now = log_clock()
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


def log_clock() -> datetime:
    """Now, truncated to the millisecond: the precision of a changeset's ``at``.

    Responses show times with milliseconds (API.md), so storing more would make
    a time copied from a response name a moment just *before* the changeset it
    came from (``as_of_time`` would miss it). Entity rows take the same value,
    so an entity's ``updated_at`` is its last changeset's ``at``. Rows written
    before this rule keep their microseconds; ``changesets.selectors.asof.as_of_time``
    compares at milliseconds for them.
    """
    now = timezone.now()
    return now.replace(microsecond=now.microsecond - now.microsecond % 1000)


class _HeadMissing(Exception):
    """The log head's row is gone (a flushed test database); recreate it, retry."""


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
        raise _HeadMissing()
    changeset.seq, changeset.at = row[:2]
    # Stored as bytes; hex text from here on, as the model reads it (``changesets.fields``).
    # No prev_hash, as the row has none (migration 0034): it is the previous row's hash.
    changeset.hash = to_hex(row[2])
    return json.loads(row[4])


def _read_versions(initial: Mapping[EntityKey, StoredEntity]) -> dict[EntityKey, int]:
    """The version each existing row was read at: what an unlocked write's
    compare-and-set expects to find."""
    return {key: entity.version for key, entity in initial.items()}


def _last_versions(branch: str, keys: Sequence[EntityKey]) -> dict[EntityKey, int]:
    """The highest version each (currently absent) key ever had, from its history.

    On a branch, the baseline's history counts too: a branch's versions of a
    key continue the baseline's, so an ETag never names two different states.
    """
    # Raw SQL buys a LATERAL newest-revision probe per key on the history index, in one
    # statement; the keys go over as one JSON document, like every write statement's.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT k.ns, k.kind, k.slug, GREATEST(b.v, o.v)"
            " FROM (SELECT v->>0 AS ns, v->>1 AS kind, v->>2 AS slug"
            "  FROM jsonb_array_elements(%s::jsonb) v) k"
            " LEFT JOIN LATERAL ("
            "   SELECT COALESCE(r.after_version, r.before_version) AS v"
            "   FROM changesets_revision r"
            "   WHERE r.branch = '' AND r.namespace = k.ns AND r.kind = k.kind"
            "     AND r.slug = k.slug"
            "   ORDER BY r.seq DESC LIMIT 1) b ON TRUE"
            " LEFT JOIN LATERAL ("
            "   SELECT COALESCE(r.after_version, r.before_version) AS v"
            "   FROM changesets_revision r"
            "   WHERE r.branch = %s AND r.branch <> '' AND r.namespace = k.ns"
            "     AND r.kind = k.kind AND r.slug = k.slug"
            "   ORDER BY r.seq DESC LIMIT 1) o ON TRUE"
            " WHERE b.v IS NOT NULL OR o.v IS NOT NULL",
            [json.dumps([[k.namespace, k.kind, k.slug] for k in keys]), branch],
        )
        return {EntityKey(ns, kind, slug): v for ns, kind, slug, v in cursor.fetchall()}
