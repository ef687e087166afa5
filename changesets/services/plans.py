"""Plans: a digest of exactly what a write would record, to confirm it later.

A dry run (``changeset_apply(dry_run=True)``) computes the net changes a
write would make; :func:`plan_digest` names them. A caller that shows the
dry run and later confirms it (the MCP server's ``plan_token``) passes that
digest back as ``expect_plan``; the write service compares it under its row
locks, after folding and before recording, and refuses with
:class:`~changesets.exceptions.PlanChanged` when the write would record
anything else. So "confirm" writes exactly what was previewed, or nothing:
no window between a second dry run and the write.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from changesets.ops import canonical
from changesets.services.netchange import NetChange


def plan_digest(*, branch: str, changes: Sequence[NetChange]) -> str:
    """SHA-256 over the branch and each net change (key, op, both images, both versions).

    Versions are in it, so a plan previewed on one state never confirms on a
    later state that merely holds equal content: the entity moved in between,
    and the caller should look again. Order is the write's own (first touch).
    """
    body = canonical(
        {
            "branch": branch,
            "changes": [
                [
                    c.key.namespace,
                    c.key.kind,
                    c.key.slug,
                    c.op,
                    c.before,
                    c.after,
                    c.before_version,
                    c.after_version,
                ]
                for c in changes
            ],
        }
    )
    return hashlib.sha256(body.encode()).hexdigest()
