"""Revisions: one entity's before and after images across one changeset."""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import F, Func, Q

from changesets.fields import PointerListField
from changesets.keyhash import HashOf, KeyHash, KeyIs
from changesets.models.changeset import BASELINE, AppendOnlyModel, Changeset, Op
from changesets.undo import before_image


class RevisionQuerySet(models.QuerySet["Revision"]):
    """Revisions; ``before`` may be named in ``values()`` and ``values_list()``.

    ``before`` is no column (``Revision.before``): named there, it is the image
    rebuilt in SQL (``atlas_before_image``, migration 0029), so a caller who
    asked for it by name keeps getting the whole image.
    """

    def values(self, *fields: Any, **expressions: Any) -> Any:
        return models.QuerySet.values(self._with_before(fields), *fields, **expressions)

    def values_list(self, *fields: Any, flat: bool = False, named: bool = False) -> Any:
        return models.QuerySet.values_list(
            self._with_before(fields), *fields, flat=flat, named=named
        )

    def of_entity(self, branch: str, namespace: str, kind: str, slug: str) -> RevisionQuerySet:
        """One key's revisions on one branch: a seek on ``revision_key``."""
        return self.alias(key_hash=KeyHash()).filter(
            KeyIs(branch, namespace, kind, slug), key_hash=HashOf(branch, namespace, kind, slug)
        )

    def _with_before(self, fields: tuple[Any, ...]) -> RevisionQuerySet:
        if "before" in fields and "before" not in self.query.annotations:
            return self.annotate(before=before_image_sql())
        return self


def before_image_sql() -> Func:
    """``atlas_before_image(op, after, undo, undo_gone)``: a revision's before image in SQL."""
    return Func(
        F("op"),
        F("after"),
        F("undo"),
        F("undo_gone"),
        function="atlas_before_image",
        output_field=models.JSONField(),
    )


class Revision(AppendOnlyModel):
    """One entity's before and after images across one changeset.

    Each row is true on its own, so history never depends on an unbroken chain:
    it holds ``after`` whole and, in ``undo`` and ``undo_gone``, what turns it
    back into ``before`` (:mod:`changesets.undo`: what an update changed, the
    whole image of a delete), never a reference to another row. ``before`` is
    that image rebuilt. ``seq``, ``branch`` and ``at`` are copied from the
    changeset so history and as-of reads need no join (``verify_log`` checks
    the copies).
    """

    # Reads find a changeset's revisions by its seq (``revision_seq_entity``, the
    # partition key). The database's foreign key goes by that seq too (migration
    # 0031, ``revision_changeset_seq``): its check when a changeset row is deleted
    # (an archive cut) is then a seek on that index, where a key on
    # ``changeset_id`` needed an index of its own (30 bytes a revision).
    # ``verify_log`` checks that ``changeset_id`` names the seq's changeset. The
    # relation joins by seq as well (migration 0038): the changeset table is
    # partitioned by seq, so a join by seq reads the one partition that holds it,
    # where a join by id alone would probe every partition.
    changeset_id = models.UUIDField()
    seq = models.BigIntegerField()
    changeset = models.ForeignObject(
        Changeset,
        on_delete=models.DO_NOTHING,
        related_name="revisions",
        from_fields=["seq"],
        to_fields=["seq"],
    )
    branch = models.CharField(max_length=63, blank=True, default=BASELINE)
    at = models.DateTimeField()
    namespace = models.CharField(max_length=200)
    kind = models.CharField(max_length=100)
    slug = models.CharField(max_length=200)
    op = models.CharField(max_length=6, choices=Op.choices)
    # The before image as what differs from ``after`` (migration 0029,
    # :mod:`changesets.undo`): NULL for a create, the whole image for a delete,
    # for an update the members of before that after changed or removed (NULL
    # when none). Read ``before``, not this.
    undo = models.JSONField(null=True)
    after = models.JSONField(null=True)
    before_version = models.PositiveIntegerField(null=True)
    after_version = models.PositiveIntegerField(null=True)
    # RFC 6901 pointers of what changed (API.md "Changed keys"), computed by the
    # log statement (``atlas_changed_keys``, migration 0013) from both images.
    # Stored, not derived on read: the GIN index ``revision_changed_keys`` (terms
    # only, in the index) answers key-filtered history from it.
    changed = PointerListField(default=list)
    # The chain's salt (``changesets.chain``, v2): the images' top-level members
    # are committed to as MACs keyed from it. An erasure sets it to NULL and
    # keeps what verification still needs in ``sealed``: the kept digest of each
    # erased member and the key of every other one. The only UPDATE the guard
    # (migration 0017) lets through is that one.
    salt = models.BinaryField(null=True, editable=False)
    sealed = models.JSONField(null=True, editable=False)
    # An update's members that after has and before had not (NULL when none, and
    # for a create or a delete): the rest of what rebuilds ``before``.
    undo_gone = ArrayField(models.TextField(), null=True)

    objects = RevisionQuerySet.as_manager()

    class Meta:
        ordering = ["seq", "id"]
        # Entity history, blame and as-of seek one key's revisions newest first on
        # ``revision_key`` (migration 0041: a hash of branch and key, then seq; an
        # expression index, so it is SQL there and spelled by ``changesets.keyhash``).
        indexes = [
            # As-of listings walk the keys that ever existed in key order (one
            # create row per key life), then seek each key's newest revision.
            models.Index(
                fields=["branch", "namespace", "kind", "slug", "-seq"],
                condition=Q(op="create"),
                name="revision_creates",
            ),
            # The trash walks the keys ever deleted, in key order, each's newest
            # delete first (``changesets.selectors.restore.deleted_entities``).
            models.Index(
                fields=["branch", "namespace", "kind", "slug", "-seq"],
                condition=Q(op="delete"),
                name="revision_deletes",
            ),
        ]
        constraints = [
            # One revision per (entity, changeset) (invariant 4): a changeset has
            # exactly one seq, so the key per seq is the key per changeset. Led by
            # seq, the table's partition key (migration 0025: every unique
            # constraint of a partitioned table must include it), it is also the
            # seq index: the change feed, "everything after seq N", archive cuts
            # and a changeset's revisions (found by its seq, then ``changeset_id``
            # checked) all read it (migration 0028 put it in place of
            # ``revision_one_per_entity_changeset`` and ``revision_seq``). The
            # primary key in the database is ``(id, seq)`` for the same reason;
            # Django's view of it stays ``id`` (ids are unique: one identity
            # sequence draws them all).
            models.UniqueConstraint(
                fields=["seq", "namespace", "kind", "slug"],
                name="revision_seq_entity",
            ),
            # An update's undo may be NULL: it changed only by adding members, or an
            # erasure made what it changed read alike on both sides.
            models.CheckConstraint(
                condition=(
                    Q(op="create", undo__isnull=True, undo_gone__isnull=True, after__isnull=False)
                    | Q(op="update", after__isnull=False)
                    | Q(op="delete", undo__isnull=False, undo_gone__isnull=True, after__isnull=True)
                ),
                name="revision_images_match_op",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.op} {self.namespace}/{self.kind}/{self.slug} @{self.seq}"

    @property
    def before(self) -> dict[str, Any] | None:
        """The before image: given to the instance (built in memory), else rebuilt
        from the row (:func:`changesets.undo.before_image`), a new dict each read."""
        given = self.__dict__.get("_before_image", _UNGIVEN)
        if given is not _UNGIVEN:
            return given
        return before_image(self.op, self.after, self.undo, self.undo_gone)

    @before.setter
    def before(self, image: dict[str, Any] | None) -> None:
        # ``Revision(before=...)`` (Django passes a property's keyword to it): an
        # instance the write path builds from the images it already holds.
        self.__dict__["_before_image"] = image


_UNGIVEN = object()
