"""The one write path: apply an ordered op list to a store as one changeset.

Every entry point (PUT/PATCH/DELETE, batch, delete-by-query, and later revert,
import and merge) calls :func:`changeset_apply`, which is what makes every
entity's history complete (DESIGN invariant 1).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import json_merge_patch
import uuid6
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from atlas.db import prepared_cursor
from atlas.exceptions import NotFound, PayloadTooLarge, PreconditionFailed, ValidationFailed
from changesets import chain
from changesets.exceptions import TooManyOps
from changesets.hooks import run_write_hooks
from changesets.models import (
    BASELINE,
    Changeset,
    LogHead,
    Op,
    Revision,
    Rpc,
)
from changesets.ops import (
    DeleteOp,
    IfMatch,
    OpResult,
    PatchOp,
    PutOp,
    WriteOp,
    canonical,
    op_repr,
)
from entities import access
from entities.models import Namespace
from entities.store import (
    BaselineStore,
    EntityKey,
    EntityStore,
    EntityWrite,
    KeyRaced,
    StoredEntity,
    WriteSql,
    json_array,
)
from entities.validation import (
    MSG_BAD_TEXT,
    MSG_CONTENT_OBJECT,
    MSG_CONTENT_TOO_LARGE,
    as_stored,
    find_nul,
)

MAX_ATTEMPTS = 5
# PostgreSQL's codes for "try the whole transaction again".
RETRYABLE_SQLSTATES = {"40P01", "40001"}


@dataclass(slots=True)
class _KeyState:
    exists: bool
    content: dict[str, Any] | None
    version: int | None
    # ``content`` in canonical form (``ops.canonical``), made at most once.
    text: str | None = None


def _text_of(state: _KeyState) -> str:
    if state.text is None:
        state.text = canonical(state.content)
    return state.text


def _same(state: _KeyState, content: Any, text: str) -> bool:
    """``same_content(state.content, content)``, reusing both canonical forms."""
    return state.content == content and _text_of(state) == text


@dataclass(frozen=True, slots=True)
class _NetChange:
    """One key's net change in a changeset: what its revision row records."""

    key: EntityKey
    op: Op
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    before_version: int | None
    after_version: int | None
    before_text: str | None
    after_text: str | None


_REVISION_FIELDS = (
    "id",
    "changeset_id",
    "seq",
    "branch",
    "at",
    "namespace",
    "kind",
    "slug",
    "op",
    "before",
    "after",
    "before_version",
    "after_version",
)


@dataclass
class ApplyResult:
    """What :func:`changeset_apply` did (or, on a dry run, would do).

    ``revisions`` are built on first use (in memory, never re-read): model
    instances cost more than the rows' insert, and not every caller wants them.
    """

    changeset: Changeset | None
    results: list[OpResult]
    entities: dict[EntityKey, StoredEntity | None] = field(default_factory=dict)
    dry_run: bool = False
    changes: Sequence[_NetChange] = field(default=(), repr=False)
    branch: str = BASELINE

    @functools.cached_property
    def revisions(self) -> list[Revision]:
        cs = self.changeset
        cs_id, seq, at = (cs.id, cs.seq, cs.at) if cs is not None else (None, None, None)
        # Positional arguments (the concrete fields in order) build a model
        # instance about 2.5 times faster than keywords; keywords if the model's
        # fields ever stop matching this order.
        positional = tuple(f.attname for f in Revision._meta.concrete_fields) == _REVISION_FIELDS
        out = []
        for c in self.changes:
            values = (
                None,
                cs_id,
                seq,
                self.branch,
                at,
                c.key.namespace,
                c.key.kind,
                c.key.slug,
                c.op,
                c.before,
                c.after,
                c.before_version,
                c.after_version,
            )
            revision = (
                Revision(*values)
                if positional
                else Revision(**dict(zip(_REVISION_FIELDS, values, strict=True)))
            )
            if cs is not None:
                revision.changeset = cs
            out.append(revision)
        return out


Planner = Callable[[Mapping[EntityKey, StoredEntity]], Sequence[WriteOp]]


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
    limit = settings.ATLAS_MAX_BATCH_OPS
    if count > limit:
        raise TooManyOps(count, limit, what=what)


def changeset_apply(
    *,
    store: EntityStore,
    actor: AbstractBaseUser,
    ops: Sequence[WriteOp] = (),
    rpc: Rpc | str,
    comment: str = "",
    dry_run: bool = False,
    check_permissions: bool = True,
    plan: Planner | None = None,
    keys: Sequence[EntityKey] = (),
) -> ApplyResult:
    """Apply ``ops`` in order as one changeset on ``store``, in one transaction.

    Instead of ``ops``, a caller that must decide its ops from the current
    state (revert, merge) passes ``keys`` and ``plan``: ``plan`` is called with
    the locked rows of ``keys`` (absent keys missing from the mapping) inside
    the transaction, and returns the ops, or raises to refuse. Deciding under
    the lock is what makes "nothing moved since" checks race-free.

    Why it is shaped this way:

    1. Existing rows are locked (``FOR UPDATE``, in key order) before any
       precondition is read, so If-Match can never lose an update.
    2. Ops run in memory against that locked state; later ops see earlier
       ones. Each key folds to one net change: first ``before``, last ``after``
       (invariant 4). A key whose net change is nothing writes nothing.
    3. Nothing moved, or a dry run: return without a changeset (invariant 3).
    4. One statement (:func:`_write_log`) writes the entity rows set-based,
       then draws ``seq`` by updating the one-row log head, whose lock is
       held to commit, so seq order is commit order (invariant 6); the same
       update computes the chain hash (``changesets.chain``), and the
       statement inserts the changeset, its revisions and its journal entry.
       (A branch or merge store writes its rows in a statement of its own
       first.) The write hooks (``changesets.hooks``) run after it, still
       inside the transaction.

    A create that loses a race to a concurrent create, or a deadlock, rolls
    the attempt back and retries it whole: the retry sees the winner's row
    and judges its preconditions against it.

    More than ``ATLAS_MAX_BATCH_OPS`` ops (:func:`check_op_limit`) is refused
    before anything is locked; a plan's ops are counted when it returns.
    """
    if plan is None:
        check_op_limit(len(ops))
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with transaction.atomic(durable=True):
                return _apply_once(
                    store=store,
                    actor=actor,
                    ops=ops,
                    plan=plan,
                    plan_keys=keys,
                    rpc=str(rpc),
                    comment=comment,
                    dry_run=dry_run,
                    check_permissions=check_permissions,
                )
        except KeyRaced:
            if attempt == MAX_ATTEMPTS:
                raise
        except _HeadMissing:
            # The migration creates the row; recreate it if someone removed it
            # (a transactional test's flush does), then write again.
            LogHead.objects.get_or_create(id=1)
            if attempt == MAX_ATTEMPTS:
                raise
        except OperationalError as exc:
            sqlstate = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
            if sqlstate not in RETRYABLE_SQLSTATES or attempt == MAX_ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass
class PlannedResult:
    """What a planned write (revert, import) did: the ops it chose, as batch ops."""

    changeset: Changeset | None
    ops: list[dict[str, Any]]
    dry_run: bool
    applied: ApplyResult


def changeset_apply_planned(
    *,
    store: EntityStore,
    actor: AbstractBaseUser,
    rpc: Rpc | str,
    keys: Sequence[EntityKey],
    plan: Planner,
    comment: str = "",
    dry_run: bool = False,
    check_permissions: bool = True,
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
    )
    return PlannedResult(result.changeset, [op_repr(op) for op in planned], dry_run, result)


def _check_precondition(op: WriteOp, state: _KeyState) -> None:
    if_match: IfMatch = op.if_match
    if if_match is not None:
        if not state.exists:
            raise PreconditionFailed(
                f"{op.key} does not exist, so If-Match cannot hold.", pointer=op.pointer
            )
        allowed = if_match if isinstance(if_match, tuple) else (if_match,)
        if if_match != "*" and state.version not in allowed:
            *others, last = map(str, allowed)
            wanted = f"{', '.join(others)} or {last}" if others else last
            raise PreconditionFailed(
                f"{op.key} is at version {state.version}, not {wanted}.", pointer=op.pointer
            )
    if isinstance(op, PutOp) and op.if_none_match and state.exists:
        raise PreconditionFailed(f"{op.key} already exists.", pointer=op.pointer)


def _checked_content(op: WriteOp, content: Any) -> tuple[dict[str, Any], str]:
    """Validate content whoever built the op (API, import, revert), and normalize
    it to what jsonb stores, so comparisons and revision images are exact.

    Returns the content and its canonical JSON text: the one serialization the
    size check, comparisons, the entity and revision rows and the chain share.
    """
    where = (op.pointer or "") + "/content"

    def invalid(detail: str, pointer: str) -> ValidationFailed:
        return ValidationFailed(
            detail, pointer=op.pointer, errors=[{"pointer": pointer, "detail": detail}]
        )

    if not isinstance(content, dict):
        raise invalid(MSG_CONTENT_OBJECT, where)
    bad = find_nul(content)
    if bad is not None:
        raise invalid(MSG_BAD_TEXT, where + bad)
    try:
        content = as_stored(content)
    except ValueError as exc:
        raise invalid(str(exc), where) from exc
    text = canonical(content)
    # Same measure as entities.validation.encoded_size (compact UTF-8; key order
    # does not change the length). At most 4 bytes a character: most content
    # needs no encoding to know it is under the limit.
    limit = settings.ATLAS_MAX_CONTENT_BYTES
    if len(text) * 4 > limit and (size := len(text.encode())) > limit:
        raise PayloadTooLarge(
            MSG_CONTENT_TOO_LARGE.format(size=size, limit=limit), pointer=op.pointer
        )
    return content, text


def _apply_once(
    *,
    store: EntityStore,
    actor: AbstractBaseUser,
    ops: Sequence[WriteOp],
    plan: Planner | None,
    plan_keys: Sequence[EntityKey],
    rpc: str,
    comment: str,
    dry_run: bool,
    check_permissions: bool,
) -> ApplyResult:
    branch = store.branch
    touched = [(k, None) for k in plan_keys] if plan else [(op.key, op.pointer) for op in ops]
    keys = list(dict.fromkeys(k for k, _ in touched))  # first-touch order

    # Namespaces must exist (staff create them) and be writable by the actor.
    # The store reads them in its lock statement, locking rows only where the
    # guard says the actor may write, so a refused caller never holds a lock.
    first_pointer: dict[str, str | None] = {}
    for key, pointer in touched:
        first_pointer.setdefault(key.namespace, pointer)
    guard = access.write_guard(actor, branch=branch) if check_permissions else None
    initial, existing = store.lock(keys, guard=guard)
    namespaces: dict[str, Namespace] = {}
    for name, pointer in first_pointer.items():
        if name not in existing:
            raise NotFound(f"Namespace {name!r} not found.", pointer=pointer)
    for name in sorted(existing):  # the order the checks ran in before (by name)
        namespaces[name] = Namespace.from_db(
            connection.alias, ["name", "protected"], (name, existing[name])
        )
    if check_permissions:
        access.require_write(actor, namespaces, branch=branch, pointers=first_pointer)

    if plan is not None:
        ops = list(plan(initial))
        check_op_limit(len(ops))
        stray = {op.key for op in ops} - set(keys)
        if stray:
            raise AssertionError(f"plan touched keys it did not lock: {sorted(stray)}")
    missing = [k for k in keys if k not in initial]
    last_versions = _last_versions(branch, missing) if missing else {}

    def next_version(key: EntityKey) -> int:
        # Versions never restart: a re-created key continues after its last
        # version, so an old ETag can never match a new incarnation.
        if key in initial:
            return initial[key].version + 1
        return last_versions.get(key, 0) + 1

    base: dict[EntityKey, _KeyState] = {
        k: _KeyState(True, e.content, e.version) for k, e in initial.items()
    }
    state: dict[EntityKey, _KeyState] = {
        k: base.get(k) or _KeyState(False, None, None) for k in keys
    }
    results: list[OpResult] = []
    for op in ops:
        cur = state[op.key]
        _check_precondition(op, cur)
        if isinstance(op, DeleteOp):
            if not cur.exists and op.missing_ok:
                results.append(OpResult(op.pointer, "unchanged", None))
                continue
            if not cur.exists:
                raise NotFound(f"{op.key} does not exist.", pointer=op.pointer)
            state[op.key] = _KeyState(False, None, None)
            results.append(OpResult(op.pointer, "deleted", None))
            continue
        if isinstance(op, PatchOp):
            if not cur.exists:
                raise NotFound(f"{op.key} does not exist.", pointer=op.pointer)
            new = json_merge_patch.merge(copy.deepcopy(cur.content), copy.deepcopy(op.patch))
        else:
            new = op.content
        new, text = _checked_content(op, new)
        if cur.exists and _same(cur, new, text):
            results.append(OpResult(op.pointer, "unchanged", cur.version))
            continue
        status = "updated" if cur.exists else "created"
        version = next_version(op.key)
        state[op.key] = _KeyState(True, new, version, text)
        results.append(OpResult(op.pointer, status, version))

    # Fold to one net change per key (invariant 4).
    unmoved: set[EntityKey] = set()
    creates: list[EntityWrite] = []
    updates: list[EntityWrite] = []
    deletes: list[EntityKey] = []
    changes: list[_NetChange] = []
    for key in keys:
        before, after = base.get(key), state[key]
        if after is before or (
            (before is None and not after.exists)
            or (
                before is not None
                and after.exists
                and _same(before, after.content, _text_of(after))
            )
        ):
            unmoved.add(key)  # e.g. created and deleted in one batch: no trace
            continue
        if before is None:
            op_kind = Op.CREATE
            creates.append(EntityWrite(key, after.content, after.version, _text_of(after)))
        elif not after.exists:
            op_kind = Op.DELETE
            deletes.append(key)
        else:
            op_kind = Op.UPDATE
            updates.append(EntityWrite(key, after.content, after.version, _text_of(after)))
        changes.append(
            _NetChange(
                key=key,
                op=op_kind,
                before=before.content if before else None,
                after=after.content if after.exists else None,
                before_version=before.version if before else None,
                after_version=after.version if after.exists else None,
                before_text=_text_of(before) if before else None,
                after_text=_text_of(after) if after.exists else None,
            )
        )

    if unmoved:
        # Ops on a key that ends where it began moved nothing: say so, with the
        # version the key really has, rather than a version never written.
        results = [
            OpResult(r.pointer, "unchanged", initial[op.key].version if op.key in initial else None)
            if op.key in unmoved
            else r
            for op, r in zip(ops, results, strict=True)
        ]

    if not changes or dry_run:
        return ApplyResult(
            changeset=None,
            results=results,
            entities=_final_entities(initial, state, keys, unmoved, None, timezone.now()),
            dry_run=dry_run,
            changes=changes,
            branch=branch,
        )

    changeset_id: UUID = uuid6.uuid7()
    now = log_clock()
    # The baseline's entity writes run in the log statement itself (one round
    # trip); another store writes its rows first, then the log statement runs.
    entity_sql = None
    if isinstance(store, BaselineStore):
        entity_sql = store.write_sql(
            changeset_id=changeset_id, now=now, creates=creates, updates=updates, deletes=deletes
        )
    else:
        store.apply(
            changeset_id=changeset_id, now=now, creates=creates, updates=updates, deletes=deletes
        )
    revisions_hex = chain.digest_lines(
        chain.revision_line(
            namespace=c.key.namespace,
            kind=c.key.kind,
            slug=c.key.slug,
            op=c.op,
            before_text=c.before_text,
            after_text=c.after_text,
            before_version=c.before_version,
            after_version=c.after_version,
            branch=branch,
        )
        for c in changes
    )
    changeset = Changeset(
        id=changeset_id,
        author=actor if getattr(actor, "pk", None) else None,
        author_name=actor.get_username(),
        message=f"{rpc}: {len(changes)} change(s)",
        comment=comment or "",
        branch=branch,
        rpc=rpc,
        op_count=len(changes),
        namespaces=sorted({c.key.namespace for c in changes}),
    )
    _write_log(
        changeset,
        changes,
        now=now,
        revisions_hex=revisions_hex,
        journal=branch == BASELINE,
        entity_sql=entity_sql,
        creates=len(creates),
    )
    # From here to COMMIT this transaction holds the log head's lock: keep it short.
    run_write_hooks(changeset)
    # Post-commit work needs nothing from here: the journal row (_write_log) notifies
    # the relay at COMMIT (changesets.outbox.relay).
    return ApplyResult(
        changeset=changeset,
        results=results,
        entities=_final_entities(initial, state, keys, unmoved, changeset_id, now),
        changes=changes,
        branch=branch,
    )


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
    changes: Sequence[_NetChange],
    *,
    now: datetime,
    revisions_hex: str,
    journal: bool,
    entity_sql: WriteSql | None = None,
    creates: int = 0,
) -> None:
    """Draw seq and write the log, in one statement (data-modifying CTEs): the
    entity writes (``entity_sql``, the baseline's), then the log head's update,
    which takes its lock, draws ``seq`` and ``at`` and computes the chain hash
    in PostgreSQL (``chain.hash_sql``), then the changeset, its revisions and
    (baseline) its journal entry. Sets ``seq``, ``at``, ``prev_hash`` and
    ``hash`` on ``changeset`` and marks it a saved row.

    One statement means the head's lock is taken after the entity rows are
    written (the update reads their row counts first) and never waits on a
    round trip to Python while held; the transaction holds it to COMMIT, so seq
    order is commit order (invariant 6). ``at`` is ``now`` (the time the entity
    rows carry, in milliseconds: :func:`log_clock`) unless a changeset that
    committed first had a later clock reading, so ``at`` never runs backwards
    in seq order.

    Revision rows are inserted from column arrays in written order (ids follow
    it, and the chain digests revisions in id order); the images go over as
    two JSON arrays of the canonical texts already made (``json_array``; an
    image is an object or absent, so a ``null`` element means absent).

    A create that lost a race inserted nothing: the head is not moved, nothing
    is logged, and :class:`KeyRaced` retries the whole write.
    """
    # One JSON document of keys, ops and versions, and one per image column
    # (json_array), instead of eight arrays: psycopg adapts arrays in Python.
    rows = json.dumps(
        [
            [c.key.namespace, c.key.kind, c.key.slug, str(c.op), c.before_version, c.after_version]
            for c in changes
        ]
    )
    befores = json_array(c.before_text for c in changes)
    afters = json_array(c.after_text for c in changes)
    cs = changeset
    # Truncated again in SQL: a log head written before the millisecond rule
    # may still hold microseconds.
    at = (
        "date_trunc('milliseconds',"
        " GREATEST(%(now)s::timestamptz, COALESCE(at, %(now)s::timestamptz)))"
    )
    prev = f"COALESCE(NULLIF(hash, ''), '{chain.GENESIS}')"
    new_hash = chain.hash_sql(prev=prev, at=at, seq="seq + 1", middle="%(middle)s")
    if entity_sql is not None:
        with_entities = (
            f"{entity_sql.ctes}, w AS (SELECT {entity_sql.created} AS created,"
            f" {entity_sql.written} AS written),"
        )
        head_from, head_where = " FROM w", " AND w.created = %(creates)s::bigint"
        tail = ", w.created FROM w LEFT JOIN h ON TRUE"
        params: dict[str, Any] = dict(entity_sql.params)
    else:
        with_entities, head_from, head_where, tail, params = "", "", "", ", 0 FROM h", {}
    journal_sql = (
        " j AS (INSERT INTO changesets_journalentry (changeset_id, phase, created_at,"
        " published_at, attempts, last_error, failures)"
        " SELECT %(id)s::uuid, 'committed', h.at, NULL, 0, '', 0 FROM h),"
        if journal
        else ""
    )
    sql = (
        f"WITH {with_entities}"
        f" h AS (UPDATE changesets_loghead SET seq = seq + 1, at = {at}, prev_hash = {prev},"
        f" hash = {new_hash}{head_from} WHERE id = 1{head_where}"
        " RETURNING seq, at, prev_hash, hash),"
        " c AS (INSERT INTO changesets_changeset (id, seq, author_id, author_name, at,"
        " message, comment, branch, rpc, op_count, namespaces, prev_hash, hash)"
        " SELECT %(id)s::uuid, h.seq, %(author)s::int, %(author_name)s::text, h.at,"
        " %(message)s::text, %(comment)s::text, %(branch)s::text, %(rpc)s::text,"
        " %(op_count)s::int, %(namespaces)s::varchar[], h.prev_hash, h.hash FROM h),"
        f"{journal_sql}"
        " r AS (INSERT INTO changesets_revision (changeset_id, seq, branch, at, namespace,"
        " kind, slug, op, before, after, before_version, after_version)"
        " SELECT %(id)s::uuid, h.seq, %(branch)s::text, h.at, r.k->>0, r.k->>1, r.k->>2,"
        " r.k->>3, NULLIF(r.before, 'null'), NULLIF(r.after, 'null'), (r.k->>4)::int,"
        " (r.k->>5)::int"
        " FROM h CROSS JOIN ROWS FROM (jsonb_array_elements(%(rows)s::jsonb),"
        " jsonb_array_elements(%(befores)s::jsonb), jsonb_array_elements(%(afters)s::jsonb))"
        " WITH ORDINALITY AS r(k, before, after, n) ORDER BY r.n)"
        f" SELECT h.seq, h.at, h.prev_hash, h.hash{tail}"
    )
    params.update(
        {
            "now": now,
            "creates": creates,
            "middle": chain.header_middle(cs, revisions_hex),
            "id": cs.id,
            "author": cs.author_id,
            "author_name": cs.author_name,
            "message": cs.message,
            "comment": cs.comment,
            "branch": cs.branch,
            "rpc": cs.rpc,
            "op_count": cs.op_count,
            "namespaces": cs.namespaces,
            "rows": rows,
            "befores": befores,
            "afters": afters,
        }
    )
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None or row[0] is None:
        # The head did not move: a create lost its race (fewer rows inserted than
        # meant), or else the head's row is gone.
        if row is not None and row[4] != creates:
            raise KeyRaced()
        raise _HeadMissing()
    cs.seq, cs.at, cs.prev_hash, cs.hash = row[:4]
    cs._state.adding = False
    cs._state.db = connection.alias


def _last_versions(branch: str, keys: Sequence[EntityKey]) -> dict[EntityKey, int]:
    """The highest version each (currently absent) key ever had, from its history.

    On a branch, the baseline's history counts too: a branch's versions of a
    key continue the baseline's, so an ETag never names two different states.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT k.ns, k.kind, k.slug, GREATEST(b.v, o.v)"
            " FROM unnest(%s::text[], %s::text[], %s::text[]) AS k(ns, kind, slug)"
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
            [
                [k.namespace for k in keys],
                [k.kind for k in keys],
                [k.slug for k in keys],
                branch,
            ],
        )
        return {EntityKey(ns, kind, slug): v for ns, kind, slug, v in cursor.fetchall()}


def _final_entities(
    initial: dict[EntityKey, StoredEntity],
    state: dict[EntityKey, _KeyState],
    keys: Sequence[EntityKey],
    unmoved: set[EntityKey],
    changeset_id: UUID | None,
    now: Any,
) -> dict[EntityKey, StoredEntity | None]:
    """Each key's state after the changeset, built from memory (no re-read)."""
    out: dict[EntityKey, StoredEntity | None] = {}
    for key in keys:
        after, before = state[key], initial.get(key)
        if not after.exists:
            out[key] = None
        elif before is not None and key in unmoved:
            out[key] = before
        else:
            out[key] = StoredEntity(
                key=key,
                content=after.content or {},
                version=after.version or 0,
                created_at=before.created_at if before else now,
                updated_at=now,
                changeset_id=changeset_id,
            )
    return out
