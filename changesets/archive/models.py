"""The archive's tables: cuts and their segments, the state at the cut, retention, rewrites.

Loaded by ``changesets.models`` (so Django registers them in the ``changesets``
app); no log table is changed here. ``ArchiveCut`` is the durable record the
archiver resumes from after a crash at any step (``changesets.archive.archiver``).
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q


class CutState(models.TextChoices):
    """The archiver's state machine, in order; each step is resumable (docs/retention.md)."""

    PLANNED = "planned"  # the cut and its segment ranges are recorded
    WRITTEN = "written"  # every segment is in the archive storage
    VERIFIED = "verified"  # read back, chain recomputed, state at the cut built and compared
    SIGNED = "signed"  # the checkpoint is signed and stored beside the segments
    SWITCHED = "switched"  # reads end at the cut (the hot rows are still there)
    REMOVED = "removed"  # the hot rows through the cut are gone: done


# The states in which reads end at the cut (``changesets.archive.boundary``) and in
# which the log's delete guard admits the removal (migration 0023).
ACTIVE_STATES = (CutState.SWITCHED, CutState.REMOVED)


class ArchiveCut(models.Model):
    """One archive cut: changesets ``from_seq..seq`` moved to signed segments.

    ``prev_hash`` is the chain hash at ``from_seq - 1`` (the previous cut's
    ``hash``, or the genesis), ``hash`` the one at ``seq``: the segments
    recompute the one from the other. ``checkpoint`` is the signed body and
    ``signature`` its Ed25519 signature (``changesets.archive.signing``);
    ``rewrites`` counts re-signings after erasures (``ArchiveRewrite``).
    """

    seq = models.BigIntegerField(unique=True)
    from_seq = models.BigIntegerField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # The v1 hash at the cut, when the cut lies inside the v1 prefix (migration 0018).
    v1_hash = models.CharField(max_length=64, blank=True, default="")
    at = models.DateTimeField()
    # The largest changeset id at or before the cut: an unknown id at or below it
    # may be archived (410), one above it is simply unknown (404).
    max_changeset_id = models.UUIDField()
    changesets = models.BigIntegerField()
    revisions = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=CutState.choices, default=CutState.PLANNED)
    checkpoint = models.JSONField(null=True, blank=True)
    signature = models.TextField(blank=True, default="")
    state_digest = models.CharField(max_length=64, blank=True, default="")
    # The newest erasure reflected in the segments (the archiver re-checks before signing).
    erasure_watermark = models.UUIDField(null=True, blank=True)
    rewrites = models.PositiveIntegerField(default=0)
    location = models.TextField()
    requested_by = models.CharField(max_length=150)
    created_at = models.DateTimeField()
    signed_at = models.DateTimeField(null=True, blank=True)
    switched_at = models.DateTimeField(null=True, blank=True)
    removed_at = models.DateTimeField(null=True, blank=True)
    # Removal's progress: every hot row at or below this seq is gone.
    removed_through = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-seq"]
        constraints = [
            models.CheckConstraint(
                condition=Q(from_seq__gte=1, seq__gte=models.F("from_seq")),
                name="archivecut_range_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"archive cut through seq {self.seq} ({self.state})"


class SegmentState(models.TextChoices):
    PLANNED = "planned"
    WRITTEN = "written"
    VERIFIED = "verified"


class ArchiveSegment(models.Model):
    """One segment file of a cut: the changesets ``first_seq..last_seq``, gzipped NDJSON.

    ``name`` is its path in ``STORAGES["atlas_archive"]``; ``digest`` the
    SHA-256 of its bytes, which the checkpoint signs. An erasure rewrites the
    file under a new name (``ArchiveRewrite``) and this row follows it.
    """

    cut = models.ForeignKey(ArchiveCut, on_delete=models.PROTECT, related_name="segments")
    name = models.CharField(max_length=300, unique=True)
    first_seq = models.BigIntegerField()
    last_seq = models.BigIntegerField()
    changesets = models.BigIntegerField()
    revisions = models.BigIntegerField()
    state = models.CharField(
        max_length=10, choices=SegmentState.choices, default=SegmentState.PLANNED
    )
    bytes = models.BigIntegerField(null=True, blank=True)
    digest = models.CharField(max_length=64, blank=True, default="")
    # The namespaces its changesets touched: an erasure rewrites only segments that hold one.
    namespaces = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    written_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["first_seq"]
        constraints = [
            models.UniqueConstraint(fields=["cut", "first_seq"], name="archivesegment_one_start"),
            models.CheckConstraint(
                condition=Q(last_seq__gte=models.F("first_seq")), name="archivesegment_range"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ArchiveBase(models.Model):
    """The baseline state at the cut, as copies of the revision rows that make it.

    Per baseline key alive at the cut: the create of its current life and its
    newest revision at or before the cut (one row when they are the same). As-of
    reads after the cut read these beside the hot revisions (``boundary.
    revision_source``), exactly as they read the revisions before the cut: the
    state at any point after it is, per key, the newest of the two.

    Rows are valid for the cuts ``valid_from <= C < valid_to`` (``valid_to``
    NULL: still valid), so the next cut prepares its rows beside these before
    reads move to it, and a reader still on the older cut reads the older rows.
    Columns are the revision's, copied byte for byte (salt and seal included):
    the checkpoint's ``state_digest`` covers them, and ``verify_log`` checks it.
    """

    revision_id = models.BigIntegerField()
    valid_from = models.BigIntegerField()
    valid_to = models.BigIntegerField(null=True, blank=True)
    changeset_id = models.UUIDField()
    seq = models.BigIntegerField()
    branch = models.CharField(max_length=63, blank=True, default="")
    at = models.DateTimeField()
    namespace = models.CharField(max_length=200)
    kind = models.CharField(max_length=100)
    slug = models.CharField(max_length=200)
    op = models.CharField(max_length=6)
    before = models.JSONField(null=True)
    after = models.JSONField(null=True)
    before_version = models.PositiveIntegerField(null=True)
    after_version = models.PositiveIntegerField(null=True)
    changed = ArrayField(models.TextField(), default=list)
    salt = models.BinaryField(null=True, editable=False)
    sealed = models.JSONField(null=True, editable=False)

    class Meta:
        indexes = [
            models.Index(fields=["namespace", "kind", "slug", "-seq"], name="archivebase_history"),
            models.Index(
                fields=["namespace", "kind", "slug", "-seq"],
                condition=Q(op="create"),
                name="archivebase_creates",
            ),
            models.Index(
                fields=["valid_to"], condition=Q(valid_to__isnull=False), name="archivebase_retired"
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["valid_from", "namespace", "kind", "slug", "seq"],
                name="archivebase_one_row",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.slug} @{self.seq} (cut {self.valid_from})"


class NamespaceRetention(models.Model):
    """How long a namespace's history stays hot, at least (docs/retention.md).

    A cut is one seq for the whole log, so a namespace's retention is a floor:
    the retention task cuts at the time that every namespace's floor allows.
    """

    namespace = models.OneToOneField(
        "entities.Namespace",
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="retention",
    )
    days = models.PositiveIntegerField(help_text="Keep at least this many days of history hot.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "namespace retention"
        constraints = [
            models.CheckConstraint(condition=Q(days__gte=1), name="retention_days_positive")
        ]

    def __str__(self) -> str:
        return f"{self.namespace_id}: {self.days} days"


class RewriteState(models.TextChoices):
    PENDING = "pending"  # asked for by the erasure's transaction
    SIGNED = "signed"  # new segments stored, the checkpoint re-signed
    DONE = "done"  # the old files deleted


class ArchiveRewrite(models.Model):
    """The record of an erasure applied to a signed cut's segments and checkpoint.

    Written as ``pending`` in the erasure's own transaction, carried out after
    it commits (storage is no transaction): the affected segments are written
    anew under new names, the checkpoint is re-signed, and only then are the
    old files deleted. ``segments`` lists ``{"old", "new", "old_digest",
    "new_digest", "revisions"}`` per rewritten file.
    """

    erasure_id = models.UUIDField()
    cut = models.ForeignKey(ArchiveCut, on_delete=models.PROTECT, related_name="rewrite_records")
    state = models.CharField(
        max_length=10, choices=RewriteState.choices, default=RewriteState.PENDING
    )
    created_at = models.DateTimeField()
    done_at = models.DateTimeField(null=True, blank=True)
    segments = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["erasure_id", "cut"], name="archiverewrite_once"),
        ]

    def __str__(self) -> str:
        return f"rewrite of cut {self.cut_id} for erasure {self.erasure_id} ({self.state})"
