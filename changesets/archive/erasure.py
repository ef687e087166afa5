"""What an erasure does to archived data (called by ``changesets.services.erase``).

Inside the erasure's transaction:

1. :func:`hold_signing_lock` — no checkpoint is signed while the erasure runs.
2. :func:`redact_state` — the state at the cut (``ArchiveBase``, every
   generation) is redacted like the revisions it copies: its rows are table
   rows, which an erasure must leave without the value.
3. :func:`request_rewrites` — every signed cut whose segments hold one of the
   erased entities' namespaces gets a pending ``ArchiveRewrite``; a cut not
   yet signed takes the erasure in before it signs (``rewrite.before_signing``).

After it commits, :func:`after_commit` carries the rewrites out, unless an
archiver holds the lock: it does them itself, and the retention task's next
run finishes any left over (``docs/retention.md``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection
from django.utils import timezone

from changesets.archive import locks, rewrite
from changesets.archive.models import ArchiveCut, ArchiveRewrite, CutState
from changesets.models import Erasure
from changesets.redaction import seal_revision
from entities.store import EntityKey

logger = logging.getLogger(__name__)
SIGNED_STATES = (CutState.SIGNED, CutState.SWITCHED, CutState.REMOVED)


def hold_signing_lock() -> None:
    """Step 1."""
    locks.hold_signing()


def redact_state(
    pointers: Mapping[EntityKey, Sequence[str]], found: list[Any], *, dry_run: bool
) -> int:
    """Step 2: redact every ``ArchiveBase`` row of the targets; rows changed."""
    changed = 0
    for key, key_pointers in pointers.items():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, salt, sealed, before, after FROM changesets_archivebase"
                " WHERE namespace = %s AND kind = %s AND slug = %s ORDER BY id",
                [key.namespace, key.kind, key.slug],
            )
            rows = cursor.fetchall()
        updates = []
        for rid, salt, sealed, before, after in rows:
            update = seal_revision(salt, sealed, before, after, key_pointers, found)
            if update is not None:
                updates.append({"id": rid, **update})
        changed += len(updates)
        if updates and not dry_run:
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE changesets_archivebase b SET before = v.before, after = v.after,"
                    " salt = NULL, sealed = v.sealed FROM jsonb_to_recordset(%s::jsonb)"
                    " AS v(id bigint, before jsonb, after jsonb, sealed jsonb) WHERE b.id = v.id",
                    [json.dumps(updates)],
                )
    return changed


def request_rewrites(erasure: Erasure) -> int:
    """Step 3: a pending rewrite per signed cut holding the erasure's namespaces."""
    cuts = ArchiveCut.objects.filter(
        state__in=SIGNED_STATES, segments__namespaces__overlap=list(erasure.namespaces)
    ).distinct()
    made = 0
    for cut in cuts:
        ArchiveRewrite.objects.create(erasure_id=erasure.id, cut=cut, created_at=timezone.now())
        made += 1
    return made


def after_commit() -> None:
    """Carry out pending rewrites now if no archiver is running (it would do them)."""
    if not ArchiveRewrite.objects.exclude(state="done").exists():
        return
    try:
        with locks.archiver():
            rewrite.run_pending()
    except locks.Busy:
        logger.info("archive rewrite deferred: an archiver holds the lock and will do it")
    except Exception:  # noqa: BLE001 - the erasure committed; the retention task retries
        logger.exception("archive rewrite failed; the retention task will retry it")
