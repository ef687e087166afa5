"""Branch writes: create, merge, abandon, members.

One module per job: :mod:`~branches.services.lifecycle` (create, abandon),
:mod:`~branches.services.merge` (the merge), :mod:`~branches.services.members`
(who may write a branch); :mod:`~branches.services.visibility` holds the
check they all make first. The services are re-exported here, so
``from branches.services import branch_merge`` names them all in one place.

Entity writes *on* a branch are not here: they go through the one write path,
``changesets.services.apply.changeset_apply``, with a :class:`branches.store.BranchStore`.
The merge goes through it too (with :class:`branches.merge.MergeStore`), so it
is an ordinary baseline changeset with a journal entry and a place in the
change feed. Sync is :mod:`branches.sync`.
"""

from branches.services.lifecycle import MSG_NAME_TAKEN, branch_abandon, branch_create
from branches.services.members import (
    MSG_MANAGE_DENIED,
    branch_member_add,
    branch_member_remove,
)
from branches.services.merge import (
    MERGE_ATTEMPTS,
    MSG_RESOLUTIONS_NEED_KEY,
    MergeResult,
    branch_merge,
)

__all__ = [
    "MERGE_ATTEMPTS",
    "MSG_MANAGE_DENIED",
    "MSG_NAME_TAKEN",
    "MSG_RESOLUTIONS_NEED_KEY",
    "MergeResult",
    "branch_abandon",
    "branch_create",
    "branch_member_add",
    "branch_member_remove",
    "branch_merge",
]
