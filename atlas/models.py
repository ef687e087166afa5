"""Cross-cutting tables: idempotency records for mutating requests."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class IdempotencyRecord(models.Model):
    """The first response to (principal, Idempotency-Key), replayed on retries.

    The row is inserted (committed) before the request runs, with
    ``response_status`` null. ``changeset_id`` is set inside the write's own
    transaction (``changesets.hooks``), so it is non-null exactly when the
    request's changeset committed: a record without a response tells a retry
    whether the lost attempt wrote anything (``atlas.api.idempotency``).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    method = models.CharField(max_length=10)
    path = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    response_status = models.PositiveSmallIntegerField(null=True)
    response_body = models.BinaryField(null=True)
    response_content_type = models.CharField(max_length=100, blank=True, default="")
    response_headers = models.JSONField(default=dict)
    # A plain id, not a foreign key: the log is append-only (the changeset can
    # never go away) and the cross-cutting app stays free of changesets' migrations.
    changeset_id = models.UUIDField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="idempotency_user_key_unique")
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created")]

    def __str__(self) -> str:
        return f"{self.key} ({self.method} {self.path})"
