"""Branch errors: all 409s, rendered as problem+json like every ``AtlasError``."""

from __future__ import annotations

from atlas.exceptions import Conflict


class BranchClosed(Conflict):
    """The branch is merged or abandoned: it takes no more writes, merges or abandons."""

    type, title = "branch-closed", "Branch closed"


class BranchExists(Conflict):
    """Branch names are never reused (the log refers to branches by name)."""

    type, title = "branch-exists", "Branch exists"


class MergeConflict(Conflict):
    """Baseline moved under entities the branch changed; ``conflicts`` lists them."""

    type, title = "merge-conflict", "Merge conflict"


class PlanMoved(Exception):
    """Internal: the branch or baseline changed between planning a merge and locking it.

    Raised inside the write transaction (rolling it back); the merge plans again.
    """


class SyncConflict(Conflict):
    """Branch and baseline changed the same pointers differently; ``conflicts`` lists them."""

    type, title = "sync-conflict", "Sync conflict"
