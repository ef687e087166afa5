"""Namespaces and live entities. Rules live in services; constraints live here too."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from entities.validation import KIND_MAX_LENGTH, NAMESPACE_MAX_LENGTH


class Namespace(models.Model):
    """A dotted name scoping entities and permissions.

    The name is the primary key so that entities order by ``(namespace, kind,
    slug)`` straight off their unique index, without a join.
    """

    name = models.CharField(primary_key=True, max_length=NAMESPACE_MAX_LENGTH)
    protected = models.BooleanField(
        default=False, help_text="Baseline writes need the maintainer role."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        # Roles are guardian object permissions; a role grant holds every
        # permission up to its level (maintainer = read + write + maintain).
        permissions = [
            ("read_namespace", "Reader: read entities, history, changesets, feed"),
            ("write_namespace", "Writer: write entities, revert"),
            ("maintain_namespace", "Maintainer: protected baseline writes, merge"),
        ]
        default_permissions = ()
        constraints = [
            models.CheckConstraint(
                condition=Q(name__regex=r"^[a-z0-9_-]+(\.[a-z0-9_-]+)*$"),
                name="namespace_name_valid",
            )
        ]

    def __str__(self) -> str:
        return self.name


class Entity(models.Model):
    """One live entity. Deleted entities have no row; their history stays in revisions.

    ``changeset_id`` names the last writer without a foreign key, because the
    app dependency runs entities <- changesets, never the other way.
    """

    # No index of its own: entity_key_unique leads with it (the FK's checks and
    # every per-namespace read use that one).
    namespace = models.ForeignKey(
        Namespace, on_delete=models.PROTECT, related_name="entities", db_index=False
    )
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    slug = models.CharField(max_length=200)
    content = models.JSONField()
    version = models.PositiveIntegerField()
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    changeset_id = models.UUIDField()

    class Meta:
        ordering = ["namespace", "kind", "slug"]
        verbose_name_plural = "entities"
        constraints = [
            models.UniqueConstraint(fields=["namespace", "kind", "slug"], name="entity_key_unique"),
            models.CheckConstraint(condition=Q(version__gte=1), name="entity_version_positive"),
            models.CheckConstraint(
                condition=Q(kind__regex=r"^[a-z][a-z0-9_]*$"), name="entity_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(slug__regex=r"^[A-Za-z0-9._-]{1,200}$"), name="entity_slug_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace_id}/{self.kind}/{self.slug}"
