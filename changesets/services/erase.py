"""Erasure: the one sanctioned rewrite of the log (DESIGN invariant 7, API.md "Erasure").

Every value at the given pointers of the given entities is replaced by
``"[erased]"`` wherever Atlas holds it or will send it: the current content
(an ``EraseEntity`` changeset on baseline and on each open branch whose
overlay holds it), every revision image on every branch (so the feed,
webhook bodies, parked deliveries, history, exports and the admin, all built
from revisions, carry no copy), stored idempotent responses and stored error
texts. The chain still verifies (``changesets.chain``: the erased member's
digest is kept, its salt destroyed). The erasure is recorded, with its
pointers and never its values, in a chain of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import uuid6
from django.contrib.auth.models import User
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from atlas.exceptions import NotFound, PermissionDenied, ValidationFailed
from atlas.models import IdempotencyRecord
from changesets import chain
from changesets.archive import erasure as archive_erasure
from changesets.models import BASELINE, Changeset, Erasure, Rpc
from changesets.ops import PutOp, WriteOp
from changesets.redaction import (
    ERASED,
    MSG_POINTER,
    parse_pointer,
    redacted,
    seal_revision,
)
from changesets.services.apply import (
    RETRYABLE_SQLSTATES,
    changeset_apply_within,
    check_op_limit,
)
from entities import access
from entities.access import Role
from entities.models import Namespace
from entities.store import EntityKey, EntityStore, StoredEntity, baseline

MAX_ATTEMPTS = 5
# Text columns are searched for erased strings of at least this many characters:
# replacing "ok" or "1" inside an error message would garble it and protect nothing.
MIN_TEXT_LENGTH = 4
CHUNK = 500
MSG_REASON = "Say why (at most 2000 characters)."

# ``overlays(keys)`` → stores of the open branches whose overlay holds any of
# ``keys``. Registered by the branches app (``changesets`` never imports it).
OverlayFinder = Callable[[Sequence[EntityKey]], Sequence[EntityStore]]
_overlay_finders: list[OverlayFinder] = []


def register_overlay_finder(finder: OverlayFinder) -> None:
    """Called by an app with overlays (branches) at startup."""
    if finder not in _overlay_finders:
        _overlay_finders.append(finder)


@dataclass(frozen=True)
class EraseTarget:
    key: EntityKey
    pointers: tuple[str, ...]


@dataclass
class EraseResult:
    erasure: Erasure
    changeset: Changeset | None
    branch_changesets: list[Changeset] = field(default_factory=list)
    dry_run: bool = False


# --- the service ------------------------------------------------------------


def entities_erase(
    *,
    actor: User,
    targets: Sequence[EraseTarget],
    reason: str,
    dry_run: bool = False,
    context: Mapping[str, Any] | None = None,
) -> EraseResult:
    """Erase the values at ``targets``' pointers everywhere Atlas holds them, in one transaction.

    Who may: a maintainer of every target's namespace (superusers are). A
    reader or writer gets 403, someone who cannot read it 404.

    1. Baseline: one ``EraseEntity`` changeset sets each pointer that still
       holds a value to ``"[erased]"`` (planned under the rows' locks).
    2. Each open branch whose overlay holds a target: its own ``EraseEntity``
       changeset on that branch.
    3. The log head is locked (held to COMMIT): no write can commit a
       revision of these entities behind the redaction's back.
    4. Every revision of the targets, on every branch (the new ones too), is
       redacted: values erased, salt destroyed, digests and keys kept
       (``changesets.redaction.seal_revision``); the guard admits exactly this UPDATE.
    5. Stored copies: idempotent responses, journal and subscription errors.
    6. The erasure row, chained to the previous one.
    7. Archived data (``changesets.archive.erasure``): the state at the cut is
       redacted with the revisions (step 4), and each signed cut holding the
       namespaces gets a pending rewrite, carried out right after COMMIT
       (segments rewritten, checkpoint re-signed, old files deleted); the
       signing lock keeps a cut from being signed halfway through this.

    A dry run takes no lock it keeps and writes nothing; it counts.
    """
    targets = _checked(targets, reason)
    _authorize(actor, {t.key.namespace for t in targets})
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with transaction.atomic(durable=True):
                result = _erase_once(actor, targets, reason, dry_run, context)
                if dry_run:
                    transaction.set_rollback(True)
            if not dry_run:
                archive_erasure.after_commit()
            return result
        except OperationalError as exc:
            sqlstate = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
            if sqlstate not in RETRYABLE_SQLSTATES or attempt == MAX_ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _checked(targets: Sequence[EraseTarget], reason: str) -> list[EraseTarget]:
    errors = []
    if not reason.strip() or len(reason) > 2000:
        errors.append({"pointer": "/reason", "detail": MSG_REASON})
    if not targets:
        errors.append({"pointer": "/targets", "detail": "Name at least one entity."})
    for i, target in enumerate(targets):
        if not target.pointers:
            errors.append({"pointer": f"/targets/{i}/pointers", "detail": MSG_POINTER})
        for j, pointer in enumerate(target.pointers):
            try:
                parse_pointer(pointer)
            except ValueError:
                errors.append({"pointer": f"/targets/{i}/pointers/{j}", "detail": MSG_POINTER})
    if errors:
        raise ValidationFailed(errors[0]["detail"], pointer=errors[0]["pointer"], errors=errors)
    check_op_limit(len(targets), what="An erasure")
    merged: dict[EntityKey, list[str]] = {}
    for target in targets:
        merged.setdefault(target.key, [])
        merged[target.key] += [p for p in target.pointers if p not in merged[target.key]]
    return [EraseTarget(k, tuple(p)) for k, p in merged.items()]


def _authorize(actor: User, namespaces: set[str]) -> None:
    """Maintainers of every namespace; 404 for one the actor cannot read, 403 below maintainer."""
    existing = set(Namespace.objects.filter(name__in=namespaces).values_list("name", flat=True))
    for name in sorted(namespaces):
        role = access.role_in(actor, name)
        if name not in existing or role < Role.READER:
            raise NotFound(f"Namespace {name!r} not found.")
        if role < Role.MAINTAINER:
            raise PermissionDenied(f"Erasing in {name!r} needs the maintainer role.")


def _erase_once(
    actor: User,
    targets: list[EraseTarget],
    reason: str,
    dry_run: bool,
    context: Mapping[str, Any] | None,
) -> EraseResult:
    """Steps 1-6 of :func:`entities_erase`, inside its transaction."""
    pointers = {t.key: t.pointers for t in targets}
    keys = list(pointers)
    found: list[Any] = []
    written = []
    stores: list[EntityStore] = [baseline]
    for finder in _overlay_finders:
        stores += list(finder(keys))
    for store in stores:  # 1, 2
        result = changeset_apply_within(
            store=store,
            actor=actor,
            rpc=Rpc.ERASE_ENTITY,
            keys=keys,
            plan=_plan(pointers, found),
            comment=f"Erasure: {reason}"[:2000],
            dry_run=dry_run,
            context=context,
        )
        if result.changeset is not None:
            written.append(result.changeset)
    with connection.cursor() as cursor:  # 3
        cursor.execute("SELECT 1 FROM changesets_loghead WHERE id = 1 FOR UPDATE")
        if not dry_run:
            cursor.execute("SET LOCAL atlas.erasing = 'on'")
    archive_erasure.hold_signing_lock()
    own = {c.id for c in written}
    redacted_count = _redact_revisions(pointers, own, found, dry_run=dry_run)  # 4
    archive_erasure.redact_state(pointers, found, dry_run=dry_run)
    if not dry_run:
        _redact_copies(pointers, found)  # 5
    erasure = _record(actor, targets, reason, redacted_count, written, dry_run=dry_run)  # 6
    if not dry_run:
        archive_erasure.request_rewrites(erasure)  # 7
    base = next((c for c in written if c.branch == BASELINE), None)
    return EraseResult(
        erasure=erasure,
        changeset=base,
        branch_changesets=[c for c in written if c.branch != BASELINE],
        dry_run=dry_run,
    )


def _plan(
    pointers: Mapping[EntityKey, Sequence[str]], found: list[Any]
) -> Callable[[Mapping[EntityKey, StoredEntity]], list[WriteOp]]:
    def plan(current: Mapping[EntityKey, StoredEntity]) -> list[WriteOp]:
        ops: list[WriteOp] = []
        for key, entity in current.items():
            content, members = redacted(entity.content, pointers[key], found)
            if members and content is not None:
                ops.append(PutOp(key, content))
        return ops

    return plan


def _branches() -> list[str]:
    """Baseline and every branch name in the log: the branches by a loose index scan of
    ``changeset_branch_seq``, which holds branch changesets only (each seek says
    ``branch <> ''`` so that the planner may use it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH RECURSIVE b(name) AS ("
            " (SELECT branch FROM changesets_changeset WHERE branch <> ''"
            "  ORDER BY branch LIMIT 1)"
            " UNION ALL SELECT (SELECT c.branch FROM changesets_changeset c"
            "  WHERE c.branch > b.name AND c.branch <> '' ORDER BY c.branch LIMIT 1)"
            " FROM b WHERE b.name IS NOT NULL)"
            " SELECT name FROM b WHERE name IS NOT NULL"
        )
        return [BASELINE, *(row[0] for row in cursor.fetchall())]


def _redact_revisions(
    pointers: Mapping[EntityKey, Sequence[str]],
    own: set[Any],
    found: list[Any],
    *,
    dry_run: bool,
) -> int:
    """Step 4: every revision of the targets on every branch; returns rows changed (not ``own``)."""
    branches, count = _branches(), 0
    for key, key_pointers in pointers.items():
        after_id = 0
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT id, changeset_id, salt, sealed,"
                    " atlas_before_image(op, after, undo, undo_gone), after"
                    " FROM changesets_revision"
                    " WHERE branch = ANY(%s) AND namespace = %s AND kind = %s AND slug = %s"
                    " AND id > %s ORDER BY id LIMIT %s",
                    [branches, key.namespace, key.kind, key.slug, after_id, CHUNK],
                )
                rows = cursor.fetchall()
            if not rows:
                break
            updates = []
            for rid, changeset_id, salt, sealed, before, after in rows:
                update = seal_revision(salt, sealed, before, after, key_pointers, found)
                if update is not None:
                    updates.append({"id": rid, **update})
                    count += changeset_id not in own
            if updates and not dry_run:
                with connection.cursor() as cursor:
                    cursor.execute(_REDACT, [json.dumps(updates)])
            after_id = rows[-1][0]
    return count


# The one UPDATE the revision guard admits (migrations 0017, 0029), under
# ``atlas.erasing``. The images are redacted whole (``seal_revision``); the row
# stores the redacted before image as it stores any (``changesets.undo``), so a
# value that only ``after`` held (unchanged by the write) goes with ``after``, and
# a changed member that now reads alike on both sides leaves ``undo``.
_REDACT = (
    "UPDATE changesets_revision r SET undo = u.undo, undo_gone = u.undo_gone, after = v.after,"
    " salt = NULL, sealed = v.sealed FROM jsonb_to_recordset(%s::jsonb)"
    " AS v(id bigint, before jsonb, after jsonb, sealed jsonb)"
    " CROSS JOIN LATERAL atlas_undo(v.before, v.after) u WHERE r.id = v.id"
)


# --- copies outside the log -------------------------------------------------


def _strings(values: Iterable[Any]) -> set[str]:
    """The erased values' strings (recursively) long enough to search text for."""
    out: set[str] = set()
    for value in values:
        if isinstance(value, str):
            if len(value) >= MIN_TEXT_LENGTH:
                out.add(value)
        elif isinstance(value, dict | list):
            out |= _strings(value.values() if isinstance(value, dict) else value)
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            out.add(text)
        elif value is not None and not isinstance(value, bool):
            text = json.dumps(value)
            if len(text) >= MIN_TEXT_LENGTH:
                out.add(text)
    return out


def _redact_copies(pointers: Mapping[EntityKey, Sequence[str]], found: list[Any]) -> None:
    """Step 5: idempotent responses (by structure, then by value) and error texts."""
    strings = _strings(found)
    _redact_idempotency(pointers, strings)
    texts = sorted(strings | {json.dumps(s)[1:-1] for s in strings}, key=len, reverse=True)
    columns = [
        ("changesets_journalentry", "last_error"),
        ("changesets_subscription", "last_error"),
        ("changesets_subscription", "parked_error"),
    ]
    with connection.cursor() as cursor:
        for table, column in columns:
            for text in texts:
                cursor.execute(
                    f"UPDATE {table} SET {column} = replace({column}, %s, %s)"
                    f" WHERE strpos({column}, %s) > 0",
                    [text, ERASED, text],
                )


_IMAGE_FIELDS = ("content", "before", "after", "new_row", "new_values", "old_values")


def _redact_body(node: Any, pointers: Mapping[EntityKey, Sequence[str]], strings: set[str]) -> Any:
    """A rendered response with the targets' values erased wherever it shows them."""
    if isinstance(node, list):
        return [_redact_body(item, pointers, strings) for item in node]
    if isinstance(node, str):
        return ERASED if node in strings else node
    if not isinstance(node, dict):
        return node
    out = {k: _redact_body(v, pointers, strings) for k, v in node.items()}
    try:
        key = EntityKey(out["namespace"], out["kind"], out["slug"])
    except (KeyError, TypeError):
        return out
    for name in _IMAGE_FIELDS:
        if key in pointers and isinstance(out.get(name), dict):
            out[name], _ = redacted(out[name], pointers[key], [])
    return out


def _redact_idempotency(pointers: Mapping[EntityKey, Sequence[str]], strings: set[str]) -> None:
    """Stored responses that mention a target's slug (or an erased string), re-rendered redacted."""
    needles = sorted({k.slug for k in pointers} | strings)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM atlas_idempotencyrecord WHERE response_body IS NOT NULL"
            " AND EXISTS (SELECT 1 FROM unnest(%s::text[]) n"
            "  WHERE position(convert_to(n, 'UTF8') IN response_body) > 0)",
            [needles],
        )
        ids = [row[0] for row in cursor.fetchall()]
    for record in IdempotencyRecord.objects.filter(pk__in=ids).only("pk", "response_body"):
        try:
            body = json.loads(bytes(record.response_body or b""))
        except ValueError:
            continue
        clean = _redact_body(body, pointers, strings)
        if clean != body:
            text = json.dumps(clean, ensure_ascii=False, separators=(",", ":")).encode()
            IdempotencyRecord.objects.filter(pk=record.pk).update(response_body=text)


# --- the record -------------------------------------------------------------


def _record(
    actor: User,
    targets: Sequence[EraseTarget],
    reason: str,
    revisions_redacted: int,
    written: Sequence[Changeset],
    *,
    dry_run: bool,
) -> Erasure:
    """Step 6: the erasure row (unsaved on a dry run), chained to the newest one."""
    author = actor if getattr(actor, "pk", None) else None
    erasure = Erasure(
        id=uuid6.uuid7(),
        author=author,
        author_name=actor.get_username(),
        at=timezone.now(),
        reason=reason,
        targets=[
            {
                "namespace": t.key.namespace,
                "kind": t.key.kind,
                "slug": t.key.slug,
                "pointers": list(t.pointers),
            }
            for t in targets
        ],
        namespaces=sorted({t.key.namespace for t in targets}),
        revisions_redacted=revisions_redacted,
        changeset_ids=[c.id for c in written],
    )
    previous = Erasure.objects.order_by("-id").values_list("hash", flat=True).first()
    erasure.prev_hash = previous or chain.GENESIS
    erasure.hash = chain.erasure_hash(prev_hash=erasure.prev_hash, erasure=erasure)
    if not dry_run:
        erasure.save(force_insert=True)
    return erasure
