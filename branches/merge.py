"""The store a merge writes baseline through.

:class:`MergeStore` is the baseline store plus a merge's bookkeeping, so a
merge is one ``changeset_apply`` call and therefore one transaction: its
``lock`` locks the branch and re-checks the merge plan under the locks, its
``write_sql`` marks the branch merged next to the baseline writes. The write
service needs no merge-specific code (and ``changesets`` never imports
``branches``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from branches.exceptions import MergeConflict, PlanMoved
from branches.models import Branch, BranchStatus
from branches.selectors import OverlayChange, overlay_changes_locked
from branches.store import close_branch, lock_branch_row, require_open
from entities.store import (
    EntityKey,
    EntityWrite,
    Locked,
    StoredEntity,
    WriteSql,
    baseline,
    guard_allows,
    namespaces_of,
)

if TYPE_CHECKING:
    from entities.access import WriteGuard


class MergeStore:
    """Baseline, plus the bookkeeping of merging one branch into it.

    ``branch`` is ``""``: to the write service this *is* baseline (baseline
    permissions, a journal entry, the change feed). The merge plan was made
    before the transaction; :meth:`lock` re-makes it under the locks and
    refuses when it no longer holds.
    """

    branch = ""

    def __init__(
        self, branch: Branch, plan: Sequence[OverlayChange], *, key_level: bool = False
    ) -> None:
        self.merging = branch
        self.key_level = key_level
        self._expected = {c.key: c.changeset_id for c in plan}

    def get(self, key: EntityKey) -> StoredEntity | None:
        return baseline.get(key)

    def list(self, **kwargs: Any) -> list[StoredEntity]:
        return baseline.list(**kwargs)

    def lock(self, keys: Iterable[EntityKey], *, guard: WriteGuard | None = None) -> Locked:
        """Lock the branch row, then baseline rows of every overlay key; re-check the plan.

        0. The keys' namespaces (existence, ``protected``). If ``guard`` refuses
           any, nothing is locked: the write service refuses the merge.

        1. Branch row ``FOR UPDATE``: a second merge (or an abandon) of the
           same branch waits here, then finds it closed (409).
        2. Baseline rows of all the branch's keys, ``FOR UPDATE`` in key order;
           changes and conflicts are computed again against the locked rows.
        3. Any conflict: 409 with the list (not for a key-level merge: its
           plan merges the locked rows pointer by pointer). Changes other than
           planned (a branch write or a baseline write slipped in before the
           locks): :class:`PlanMoved`, and the merge plans again.
        """
        wanted = set(keys)
        existing = namespaces_of(k.namespace for k in wanted) if wanted else {}
        if not guard_allows(guard, existing):
            return Locked({}, existing)
        _, name, status, *_ = lock_branch_row(self.merging.pk)
        require_open(name, status)
        changes, locked = overlay_changes_locked(branch=self.merging)
        conflicts = [c for c in changes if c.conflict]
        if conflicts and not self.key_level:
            raise merge_conflict(name, conflicts)
        if {c.key: c.changeset_id for c in changes} != self._expected:
            raise PlanMoved()
        return Locked({k: e for k, e in locked.items() if k in wanted}, existing)

    def write_sql(
        self,
        *,
        changeset_id: UUID,
        now: datetime,
        creates: Sequence[EntityWrite],
        updates: Sequence[EntityWrite],
        deletes: Sequence[EntityKey],
    ) -> WriteSql:
        """Close the branch on this changeset and drop its overlay, then hand back
        baseline's writes for the log statement.

        ``merged_changeset`` names the changeset being written: its row is
        inserted later in this same transaction (foreign keys are checked at
        commit).
        """
        close_branch(
            self.merging.pk, status=BranchStatus.MERGED, now=now, merged_changeset_id=changeset_id
        )
        return baseline.write_sql(
            changeset_id=changeset_id, now=now, creates=creates, updates=updates, deletes=deletes
        )


def merge_conflict(name: str, conflicts: Sequence[OverlayChange]) -> MergeConflict:
    return MergeConflict(
        f"Baseline changed {len(conflicts)} entit{'y' if len(conflicts) == 1 else 'ies'}"
        f" since branch {name!r} first wrote them; merge refused.",
        conflicts=[
            {
                "namespace": c.key.namespace,
                "kind": c.key.kind,
                "slug": c.key.slug,
                "reason": "baseline_moved",
                "op": c.op,
                "base_version": c.base_version,
                "baseline_version": c.baseline_version,
            }
            for c in conflicts
        ],
    )
