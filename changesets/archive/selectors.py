"""Reads of the archive's own records (checkpoints for ``GET /log/checkpoints``)."""

from __future__ import annotations

from django.db.models import QuerySet

from changesets.archive.models import ArchiveCut, CutState

PUBLISHED = (CutState.SIGNED, CutState.SWITCHED, CutState.REMOVED)


def signed_cuts(*, after_seq: int | None = None) -> QuerySet[ArchiveCut]:
    """Cuts whose checkpoint is signed, oldest first (after ``after_seq``)."""
    qs = ArchiveCut.objects.filter(state__in=PUBLISHED).order_by("seq")
    return qs.filter(seq__gt=after_seq) if after_seq is not None else qs


def newest_public_key() -> str | None:
    """The key the newest checkpoint names (when none is configured here now)."""
    cut = signed_cuts().order_by("-seq").only("checkpoint").first()
    return (cut.checkpoint or {}).get("public_key") if cut is not None else None
