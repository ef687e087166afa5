"""Step 6 of an erasure: its record, chained to the previous one (``changesets.chain``)."""

from __future__ import annotations

from collections.abc import Sequence

import uuid6
from django.contrib.auth.models import User
from django.utils import timezone

from changesets import chain
from changesets.models import Changeset, Erasure
from changesets.services.erase.targets import EraseTarget


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
