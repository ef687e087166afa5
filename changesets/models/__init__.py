"""The changeset log: changesets, revisions, the log head, erasures and re-chains.

Changesets and revisions are append-only (DESIGN invariant 7). Django's
``save()`` and ``delete()`` refuse to rewrite them, and database triggers
(migration 0002) refuse UPDATE and DELETE from any client, so the guarantee
does not depend on every caller going through the ORM.

One module per kind of table: ``changeset`` (changesets, the log head, and what
every log table shares), ``revision``, ``records`` (erasures and re-chains); the archive's and
the outbox's tables live in their own rooms. Everything is imported here, so
Django registers every model with this app and ``changesets.models`` names
them all.
"""

# The archive's and the outbox's tables live in their own rooms
# (``changesets.archive``, ``changesets.outbox``); imported here so that Django
# registers them with this app and ``changesets.models`` keeps naming them all.
from changesets.archive.models import (
    ArchiveBase,
    ArchiveCut,
    ArchiveRewrite,
    ArchiveSegment,
    NamespaceRetention,
)
from changesets.models.changeset import (
    BASELINE,
    COMMON_RPCS,
    MESSAGE_SQL,
    AppendOnlyError,
    AppendOnlyModel,
    Changeset,
    LogHead,
    Op,
    Rpc,
    default_message,
    namespace_key,
    text_key,
)
from changesets.models.records import ChainUpgrade, Erasure
from changesets.models.revision import Revision, RevisionQuerySet, before_image_sql
from changesets.outbox.models import (
    Capture,
    JournalEntry,
    JournalPhase,
    JournalTally,
    Subscription,
)

__all__ = [
    "BASELINE",
    "COMMON_RPCS",
    "MESSAGE_SQL",
    "AppendOnlyError",
    "AppendOnlyModel",
    "ArchiveBase",
    "ArchiveCut",
    "ArchiveRewrite",
    "ArchiveSegment",
    "Capture",
    "ChainUpgrade",
    "Changeset",
    "Erasure",
    "JournalEntry",
    "JournalPhase",
    "JournalTally",
    "LogHead",
    "NamespaceRetention",
    "Op",
    "Revision",
    "RevisionQuerySet",
    "Rpc",
    "Subscription",
    "before_image_sql",
    "default_message",
    "namespace_key",
    "text_key",
]
