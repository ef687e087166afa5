"""The branch overlay store, and the branch-row helpers every branch write shares.

:class:`BranchStore` implements ``entities.store.EntityStore`` over a branch:
reads see the branch's overlay rows over baseline *as it is now* (a tombstone
hides the baseline row), writes land in the overlay only. The write service
(``changesets.services.apply.changeset_apply``) drives it exactly like the baseline
store, which is how branch writes become changesets with ``branch`` set.

:class:`branches.merge.MergeStore` is the baseline store plus a merge's
bookkeeping, built on the helpers here.

Only the write service may call the mutating methods (DESIGN invariant 1).
A store keeps per-transaction state between ``lock`` and ``apply``: make one
per write (they are cheap), never share one between threads.

One module per job: :mod:`~branches.store.overlay` (the store: its reads and
locks), :mod:`~branches.store.overlay_writes` (the SQL its writes add to the
log statement), :mod:`~branches.store.branch_row` (the branch-row lock, the
checks under it, closing a branch). Everything is re-exported here.
"""

from branches.store.branch_row import (
    MSG_WRITE_DENIED,
    LockedBranch,
    close_branch,
    lock_branch_row,
    require_open,
    require_writer,
)
from branches.store.overlay import BranchStore, overlay_stores_holding

__all__ = [
    "MSG_WRITE_DENIED",
    "BranchStore",
    "LockedBranch",
    "close_branch",
    "lock_branch_row",
    "overlay_stores_holding",
    "require_open",
    "require_writer",
]
