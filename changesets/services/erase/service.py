"""The erasure service: who may erase, the ``EraseEntity`` changesets on baseline
and on each branch that holds a target, and the steps after them in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.db import OperationalError, connection, transaction

from atlas.exceptions import NotFound, PermissionDenied
from changesets.archive import erasure as archive_erasure
from changesets.models import BASELINE, Changeset, Erasure, Rpc
from changesets.ops import PutOp, WriteOp
from changesets.redaction import redacted
from changesets.services.apply import changeset_apply_within
from changesets.services.erase.copies import _redact_copies
from changesets.services.erase.record import _record
from changesets.services.erase.revisions import _redact_revisions
from changesets.services.erase.targets import EraseTarget, _checked
from changesets.services.retry import RETRYABLE_SQLSTATES
from entities import access
from entities.access import Role
from entities.models import Namespace
from entities.store import EntityKey, EntityStore, StoredEntity, baseline

MAX_ATTEMPTS = 5

# ``overlays(keys)`` → stores of the open branches whose overlay holds any of
# ``keys``. Registered by the branches app (``changesets`` never imports it).
OverlayFinder = Callable[[Sequence[EntityKey]], Sequence[EntityStore]]
_overlay_finders: list[OverlayFinder] = []


def register_overlay_finder(finder: OverlayFinder) -> None:
    """Called by an app with overlays (branches) at startup."""
    if finder not in _overlay_finders:
        _overlay_finders.append(finder)


@dataclass
class EraseResult:
    erasure: Erasure
    changeset: Changeset | None
    branch_changesets: list[Changeset] = field(default_factory=list)
    dry_run: bool = False


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
