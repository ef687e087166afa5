"""Changesets and the log head, and what every log table shares (the append-only guard,
the rpcs and ops).

Changesets and revisions are append-only (DESIGN invariant 7). Django's
``save()`` and ``delete()`` refuse to rewrite them, and database triggers
(migration 0002) refuse UPDATE and DELETE from any client, so the guarantee
does not depend on every caller going through the ORM.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import uuid6
from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import F, Func, Q, Value

from changesets.fields import ChainHashField

BASELINE = ""
# The rpcs of day-to-day writes: most of any log. Every other rpc (reverts,
# merges, imports, erasures, restores, deletes …) is rare and indexed by
# ``changeset_rare_rpc``, which only those rows' writes maintain.
COMMON_RPCS = ("PutEntity", "PatchEntity", "BatchMutate")


class Rpc(models.TextChoices):
    PUT_ENTITY = "PutEntity"
    PATCH_ENTITY = "PatchEntity"
    DELETE_ENTITY = "DeleteEntity"
    BATCH_MUTATE = "BatchMutate"
    DELETE_BY_QUERY = "DeleteByQuery"
    REVERT_CHANGESET = "RevertChangeset"
    MERGE_BRANCH = "MergeBranch"
    IMPORT_CHANGESET = "ImportChangeset"
    ERASE_ENTITY = "EraseEntity"
    RESTORE_ENTITY = "RestoreEntity"
    RESTORE_SCOPE = "RestoreScope"
    SYNC_BRANCH = "SyncBranch"


class Op(models.TextChoices):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"


class AppendOnlyError(Exception):
    """Raised when code tries to rewrite the log."""


class AppendOnlyModel(models.Model):
    class Meta:
        abstract = True

    def save(self, *args, **kwargs) -> None:
        if not self._state.adding:
            raise AppendOnlyError(f"{type(self).__name__} rows are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError(f"{type(self).__name__} rows are append-only")


class AuthoredRecord(AppendOnlyModel):
    """An append-only record of something a user did to the log, and when.

    The author's name is the record; the FK is a convenience that survives the
    user's deletion without rewriting the log (no DB constraint). Nothing looks
    records up by it (no constraint, no reverse accessor; the author filters use
    ``author_name``), so it has no index to maintain.
    """

    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    author_name = models.CharField(max_length=150)
    at = models.DateTimeField()

    class Meta:
        abstract = True


def namespace_key(position: int) -> Func:
    """``hashtextextended(namespaces[position + 1], 0)``: the namespace position
    indexes' key (migration 0037), an int8 where the name is 10-20 bytes of text.

    Why a hash: an index entry of an int8 and ``seq`` is 24 bytes, the widest
    that B-tree's split for "inserts at the end of a run of equal keys" handles
    (``_bt_afternewitemoff``), and each namespace's inserts land at the end of
    its run. With the name as key, a page that filled split in half and stayed
    half empty: 66 bytes a changeset against 32 with the hash, for writes into
    five namespaces in turn (the GIN index it replaces took 30). Equal names
    have equal hashes, so a query asks for the hash (the index's seek) and
    rechecks the name (a collision cannot show one namespace's changesets to a
    reader of another): :func:`changesets.selectors.by_namespace.at_position`.
    """
    return text_key(F(f"namespaces__{position}"))


def text_key(text: Any) -> Func:
    """``hashtextextended(text, 0)``: a namespace's key in the position indexes,
    of a column (:func:`namespace_key`) or of a name (PostgreSQL folds that one
    to a constant, so the index's expression matches)."""
    return Func(text, Value(0), function="hashtextextended", output_field=models.BigIntegerField())


class Changeset(AuthoredRecord):
    """One mutation request that moved something.

    ``seq`` is drawn from :class:`LogHead` as the last step before commit, under
    that row's lock, so seq order is commit order (invariant 6).
    """

    id = models.UUIDField(primary_key=True, default=uuid6.uuid7, editable=False)
    seq = models.BigIntegerField(unique=True)
    # author, author_name, at: AuthoredRecord's.
    # Always "<rpc>: <op_count> change(s)" (:func:`default_message`), so the log
    # statement stores NULL and :meth:`from_db` fills it in (migration 0033:
    # 23 bytes a changeset, issue 16). Rows written before keep their text; SQL
    # that reads the column spells the rule as :data:`MESSAGE_SQL`.
    message = models.CharField(max_length=200, null=True)  # noqa: DJ001 (NULL: not stored)
    comment = models.TextField(blank=True, default="")
    branch = models.CharField(max_length=63, blank=True, default=BASELINE)
    rpc = models.CharField(max_length=32, choices=Rpc.choices)
    op_count = models.PositiveIntegerField()
    namespaces = ArrayField(models.CharField(max_length=200), default=list)
    # The tamper-evident chain (changesets.chain): this changeset's hash covers
    # the previous one's, its own fields and its revisions, in seq order. Stored
    # as 32 bytes, read as hex text (``changesets.fields``, migration 0027).
    prev_hash = ChainHashField(null=True)
    hash = ChainHashField(null=True)
    # Provenance (API.md "Provenance", ``changesets.provenance``): the client's
    # ``metadata`` object and the server's ``context`` of the request. NULL when
    # there is none (no metadata sent; changesets written before 0015), which a
    # row stores as one bit of its null bitmap. The chain covers both when set.
    metadata = models.JSONField(null=True, blank=True)
    context = models.JSONField(null=True, blank=True)
    # The v1 chain hash of a changeset written before the re-chain (migration
    # 0018), committed to by its v2 header so v1 anchors stay checkable; NULL
    # (one bit) on every changeset written since.
    v1_hash = ChainHashField(null=True)

    class Meta:
        ordering = ["-seq"]
        # Ascending on seq, read backwards for "newest first": seq only rises, so
        # every insert lands on the rightmost leaf and pages fill to the fillfactor
        # (a descending index fills its leftmost leaf, which splits half-empty).
        # A time becomes the seq boundary it stands for by bisecting seq
        # (``atlas_seq_bound``, migration 0032): ``at`` never runs backwards in seq
        # order, so "at <= T" is a prefix of the log; no index on ``at``.
        indexes = [
            # Branch changesets only (issue 16, migration 0028): baseline is almost
            # every changeset, and its newest-first pages read the seq index
            # backwards, skipping the few branch rows (cheap while baseline
            # dominates); a baseline write inserts nothing here.
            models.Index(
                fields=["branch", "seq"], condition=~Q(branch=BASELINE), name="changeset_branch_seq"
            ),
            models.Index(fields=["author_name", "seq"], name="changeset_author_seq"),
            # A namespace's changesets newest first, as seeks (issue 18; migration
            # 0037, ``changesets.selectors.by_namespace``): a B-tree per position
            # of ``namespaces``, because a GIN index cannot return rows in seq
            # order and a rare namespace's page sorted every changeset it ever
            # had. Nearly every changeset touches one namespace, so the first is
            # an index of every row and the second of a batch's across two; the
            # few that touch three or more keep a GIN index of their own. Keyed
            # by the name's 64-bit hash, not the name: see ``namespace_key``.
            models.Index(namespace_key(0), F("seq"), name="changeset_ns1_seq"),
            models.Index(
                namespace_key(1),
                F("seq"),
                condition=Q(namespaces__1__isnull=False),
                name="changeset_ns2_seq",
            ),
            GinIndex(
                fields=["namespaces"],
                condition=Q(namespaces__2__isnull=False),
                name="changeset_ns3_more",
            ),
            # A rare rpc's newest changesets are a seek here; a common one's are
            # dense in the seq index, read backwards (issue 18).
            models.Index(
                fields=["rpc", "seq"],
                condition=~Q(rpc__in=COMMON_RPCS),
                name="changeset_rare_rpc",
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(seq__gte=1), name="changeset_seq_positive"),
            models.CheckConstraint(condition=Q(op_count__gte=1), name="changeset_not_empty"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.message}"

    @classmethod
    def from_db(
        cls, db: str | None, field_names: Collection[str], values: Collection[Any], **kwargs: Any
    ) -> Changeset:
        """A stored row, its message filled in where the row left it to the rule.

        Every read of a changeset instance (querysets, ``select_related``,
        ``raw``) comes through here, so ``message`` reads the same whether the
        row holds the text or NULL; the chain hashes that text either way.
        """
        changeset = super().from_db(db, field_names, values, **kwargs)
        loaded = changeset.__dict__
        if loaded.get("message", "") is None and "rpc" in loaded and "op_count" in loaded:
            changeset.message = default_message(changeset.rpc, changeset.op_count)
        return changeset


def default_message(rpc: str, op_count: int) -> str:
    """A changeset's message: what it did and how much, the only one Atlas writes."""
    return f"{rpc}: {op_count} change(s)"


# :func:`default_message` for SQL that reads changeset rows itself (archive segments).
MESSAGE_SQL = "COALESCE(message, rpc || ': ' || op_count || ' change(s)')"


class LogHead(models.Model):
    """The single row whose lock orders commits and hands out ``seq``.

    Every write transaction updates it as its last statement before inserting
    the changeset; the row lock is held until commit, so a transaction that
    drew seq N has committed before anyone can draw N+1.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    seq = models.BigIntegerField(default=0)
    # The newest changeset's time: ``at`` never runs backwards in seq order,
    # which is what makes ``as_of_time`` well defined.
    at = models.DateTimeField(null=True)
    # The newest changeset's chain hash, so anyone can anchor the log's head
    # (NULL before the first write; hex text in Python, like the changeset's).
    hash = ChainHashField(null=True)
    # The hash before ``hash``: the write statement sets both and returns them,
    # because RETURNING sees only new values and the changeset row needs the old.
    prev_hash = ChainHashField(null=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="loghead_single_row")]

    def __str__(self) -> str:
        return f"log head at seq {self.seq}"
