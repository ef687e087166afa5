"""Step 4 of an erasure: every revision of the targets, on every branch, redacted
in place by the one UPDATE the revision guard admits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection

from changesets import keyhash
from changesets.models import BASELINE
from changesets.redaction import seal_revision
from entities.store import EntityKey

CHUNK = 500


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
                    # The key on every branch: one seek on ``revision_key`` per branch.
                    f" WHERE {keyhash.key_hash('changesets_revision')} = ANY(ARRAY("
                    "  SELECT atlas_key_hash(b, %s, %s, %s) FROM unnest(%s::text[]) b))"
                    " AND branch = ANY(%s) AND namespace = %s AND kind = %s AND slug = %s"
                    " AND id > %s ORDER BY id LIMIT %s",
                    [
                        *(key.namespace, key.kind, key.slug, branches),
                        *(branches, key.namespace, key.kind, key.slug),
                        after_id,
                        CHUNK,
                    ],
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
