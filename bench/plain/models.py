"""The baseline: a plain, untracked model with the same shape as the peers' ``Item``."""

from __future__ import annotations

from django.db import models


class PlainItem(models.Model):
    namespace = models.CharField(max_length=200)
    slug = models.CharField(max_length=200)
    content = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "slug"], name="plainitem_key"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.slug}"
