"""The peers' tracked ``Item(namespace, slug, content JSON)``, one model per peer.

Each is the same shape as ``bench.plain.PlainItem`` and as an Atlas entity's
key and content, tracked the way that peer's documentation recommends:

- django-simple-history: ``HistoricalRecords()`` (a historical table, a row per save);
- django-reversion: ``@reversion.register()``, saved inside ``create_revision()``;
- django-pghistory: ``@pghistory.track()`` (insert and update snapshot triggers).
"""

from __future__ import annotations

import pghistory
import reversion
from django.db import models
from simple_history.models import HistoricalRecords


class _Item(models.Model):
    namespace = models.CharField(max_length=200)
    slug = models.CharField(max_length=200)
    content = models.JSONField()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.namespace}/{self.slug}"


class SHItem(_Item):
    history = HistoricalRecords()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "slug"], name="shitem_key")]


@reversion.register()
class RVItem(_Item):
    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "slug"], name="rvitem_key")]


@pghistory.track()
class PGHItem(_Item):
    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "slug"], name="pghitem_key")]
