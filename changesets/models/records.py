"""Records of what was done to the log itself: erasures and re-chains."""

from __future__ import annotations

import uuid6
from django.contrib.postgres.fields import ArrayField
from django.db import models

from changesets.models.changeset import AuthoredRecord


class Erasure(AuthoredRecord):
    """One erasure: who, when, why and which pointers of which entities; never the values.

    Append-only like the log (and not erasable itself). Erasures form their own
    small hash chain (``prev_hash`` → ``hash``, ``changesets.services.erase``),
    so a forged or removed erasure record is evident to ``verify_log``.
    """

    id = models.UUIDField(primary_key=True, default=uuid6.uuid7, editable=False)
    # author, author_name, at: AuthoredRecord's.
    reason = models.TextField()
    # [{"namespace", "kind", "slug", "pointers": [...]}]
    targets = models.JSONField()
    # The targets' namespaces, sorted: ``GET /erasures`` lists an erasure to
    # callers who can read all of them.
    namespaces = ArrayField(models.CharField(max_length=200), default=list)
    revisions_redacted = models.PositiveIntegerField(default=0)
    # The EraseEntity changesets this erasure wrote (baseline first, then branches).
    changeset_ids = ArrayField(models.UUIDField(), default=list, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["at", "id"], name="erasure_at_id")]

    def __str__(self) -> str:
        return f"erasure {self.id} by {self.author_name}"


class ChainUpgrade(models.Model):
    """The record of a re-chain (v1 → v2, migration 0018): the head at the cut, both ways.

    A v1 anchor ``(seq, hash)`` with ``seq <= self.seq`` is checked after the
    re-chain by ``verify_log --v1-anchor seq:hash`` (docs/architecture.md).
    """

    at = models.DateTimeField()
    from_version = models.CharField(max_length=32)
    to_version = models.CharField(max_length=32)
    seq = models.BigIntegerField()
    v1_hash = models.CharField(max_length=64)
    v2_hash = models.CharField(max_length=64)
    revisions = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.from_version} → {self.to_version} at seq {self.seq}"
