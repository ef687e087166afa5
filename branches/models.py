"""Branches and their overlay rows.

A branch is a named overlay on baseline. Its writes go through the one write
service (``changesets.services.apply.changeset_apply``) with a
:class:`branches.store.BranchStore`, so they are recorded as changesets with
``branch`` set; the overlay (:class:`BranchEntity`) holds the branch's current
state of every key it wrote. The overlay is not the log: abandoning or merging
a branch deletes its overlay rows, and its changesets stay.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q

from entities.validation import KIND_MAX_LENGTH, NAMESPACE_MAX_LENGTH

NAME_MAX_LENGTH = 63
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
MSG_NAME = "Branch names are 1-63 characters of [a-z0-9._-], starting with [a-z0-9]."


class BranchStatus(models.TextChoices):
    OPEN = "open"
    MERGED = "merged"
    ABANDONED = "abandoned"


class Branch(models.Model):
    """A named overlay forked from baseline at a changeset.

    Names are never reused: the log refers to a branch by name
    (``Changeset.branch``), so a closed branch keeps its row and its name.
    The row is also the branch's lock: every branch write, the merge and the
    abandon take it ``FOR UPDATE`` first, so they never interleave.
    """

    name = models.CharField(max_length=NAME_MAX_LENGTH, unique=True)
    status = models.CharField(
        max_length=10, choices=BranchStatus.choices, default=BranchStatus.OPEN
    )
    comment = models.TextField(blank=True, default="")
    # The creator's name is the record; the FK survives the user's deletion.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_by_name = models.CharField(max_length=150)
    created_at = models.DateTimeField()
    # The newest baseline changeset when the branch was cut (none on an empty log).
    fork_changeset = models.ForeignKey(
        "changesets.Changeset",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        # No database constraint: an archive cut removes old changesets (issue 21).
        db_constraint=False,
        related_name="+",
    )
    fork_seq = models.BigIntegerField(default=0)
    # The base point: the baseline changeset the branch's content is based on.
    # The fork at first; each sync moves it to the newest baseline changeset.
    # ``behind`` counts from here; key-level merge and sync take their base from it.
    base_changeset = models.ForeignKey(
        "changesets.Changeset",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        # No database constraint: an archive cut removes old changesets (issue 21).
        db_constraint=False,
        related_name="+",
    )
    base_seq = models.BigIntegerField(default=0)
    synced_at = models.DateTimeField(null=True, blank=True)
    merged_changeset = models.ForeignKey(
        "changesets.Changeset",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        # No database constraint: an archive cut removes old changesets (issue 21).
        db_constraint=False,
        related_name="+",
    )
    closed_at = models.DateTimeField(null=True, blank=True)
    # Every namespace the branch has written (grows, never shrinks): decides
    # who can see the branch (readers of any of them, API.md).
    namespaces = ArrayField(models.CharField(max_length=NAMESPACE_MAX_LENGTH), default=list)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "branches"
        indexes = [GinIndex(fields=["namespaces"], name="branch_namespaces")]
        constraints = [
            models.CheckConstraint(condition=Q(name__regex=NAME_PATTERN), name="branch_name_valid"),
            models.CheckConstraint(condition=Q(fork_seq__gte=0), name="branch_fork_seq_nonneg"),
            models.CheckConstraint(
                condition=Q(base_seq__gte=models.F("fork_seq")), name="branch_base_not_before_fork"
            ),
            models.CheckConstraint(
                condition=Q(merged_changeset__isnull=True) | Q(status=BranchStatus.MERGED),
                name="branch_merged_changeset_only_when_merged",
            ),
            models.CheckConstraint(
                condition=Q(status=BranchStatus.OPEN, closed_at__isnull=True)
                | (~Q(status=BranchStatus.OPEN) & Q(closed_at__isnull=False)),
                name="branch_closed_at_iff_closed",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

    @property
    def is_open(self) -> bool:
        return self.status == BranchStatus.OPEN


class BranchEntity(models.Model):
    """A branch's state of one key it wrote: live content, or a tombstone.

    ``base_version`` is the baseline version the branch started from when it
    first wrote the key (null when baseline had no such entity then); merge
    compares it with baseline's current version to find conflicts.
    """

    branch = models.ForeignKey(Branch, on_delete=models.CASCADE, related_name="overlay")
    namespace = models.ForeignKey("entities.Namespace", on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    slug = models.CharField(max_length=200)
    content = models.JSONField(null=True)
    deleted = models.BooleanField(default=False)
    version = models.PositiveIntegerField(null=True)
    base_version = models.PositiveIntegerField(null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    changeset_id = models.UUIDField()

    class Meta:
        ordering = ["branch", "namespace", "kind", "slug"]
        verbose_name_plural = "branch entities"
        constraints = [
            models.UniqueConstraint(
                fields=["branch", "namespace", "kind", "slug"], name="branch_entity_key_unique"
            ),
            models.CheckConstraint(
                condition=Q(deleted=True, content__isnull=True, version__isnull=True)
                | Q(deleted=False, content__isnull=False, version__gte=1),
                name="branch_entity_tombstone_or_live",
            ),
        ]

    def __str__(self) -> str:
        state = "tombstone" if self.deleted else f"v{self.version}"
        return f"{self.branch_id}:{self.namespace_id}/{self.kind}/{self.slug} {state}"


class BranchMember(models.Model):
    """A user the branch's creator (or a maintainer of every namespace it touched)
    lets write the branch. Membership lets a user see and write the branch; each
    namespace written still needs the writer role there.
    """

    branch = models.ForeignKey(Branch, on_delete=models.CASCADE, related_name="members")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    added_by_name = models.CharField(max_length=150)
    added_at = models.DateTimeField()

    class Meta:
        ordering = ["branch", "user"]
        constraints = [
            models.UniqueConstraint(fields=["branch", "user"], name="branch_member_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.branch_id}:{self.user_id}"
