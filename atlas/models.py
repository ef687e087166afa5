"""Cross-cutting tables: idempotency records for mutating requests, API tokens."""

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
    # Under transaction pooling (no session to hold a lock in): until when this
    # attempt is presumed alive. Null once the response is stored, and always
    # under session locks.
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="idempotency_user_key_unique")
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created")]

    def __str__(self) -> str:
        return f"{self.key} ({self.method} {self.path})"


class ApiToken(models.Model):
    """An API key for ``Authorization: Token <key>``, stored as its SHA-256 digest only.

    The key itself is shown once, when it is made (``atlas.tokens.api_token_create``),
    and never stored: a database dump, a backup or the admin cannot hand it out.
    ``prefix`` is the key's first characters, kept so people can tell their keys
    apart; it is far too short to authenticate with. A request is authenticated
    by one index seek on ``digest`` (``atlas.api.auth.TokenAuthentication``).
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The key, on the instance the admin's add page shows it from once; never a column.
    _key: str

    class Meta:
        verbose_name = "API token"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(digest__regex=r"^[0-9a-f]{64}$"), name="api_token_digest_sha256"
            )
        ]

    def __str__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"{self.prefix}…{label}"
