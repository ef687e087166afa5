"""Reads of branches: visibility, who may write them, lists, and the diff against baseline.

One module per job: :mod:`~branches.selectors.access` (who sees a branch, who
writes it), :mod:`~branches.selectors.listing` (lists and single reads), and
:mod:`~branches.selectors.diff` (the overlay against baseline: merge plans and
the branch diff). Everything is re-exported here, so
``from branches.selectors import branch_diff`` keeps naming them in one place.
"""

from branches.selectors.access import (
    can_see,
    is_member,
    is_superuser,
    is_valid_name,
    maintains_all,
    may_manage_members,
    may_write,
)
from branches.selectors.diff import (
    Diff,
    OverlayChange,
    branch_diff,
    overlay_change_counts,
    overlay_changes,
    overlay_changes_locked,
)
from branches.selectors.listing import (
    branch_fresh,
    branch_get,
    branch_list,
    member_names,
    user_by_username,
    visible_branches,
    visible_changeset_ids,
)

__all__ = [
    "Diff",
    "OverlayChange",
    "branch_diff",
    "branch_fresh",
    "branch_get",
    "branch_list",
    "can_see",
    "is_member",
    "is_superuser",
    "is_valid_name",
    "maintains_all",
    "may_manage_members",
    "may_write",
    "member_names",
    "overlay_change_counts",
    "overlay_changes",
    "overlay_changes_locked",
    "user_by_username",
    "visible_branches",
    "visible_changeset_ids",
]
