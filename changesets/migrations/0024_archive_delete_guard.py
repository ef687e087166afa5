"""The log's guard admits one DELETE: an archive cut's removal (issue 21, DESIGN invariant 7).

Until now the append-only triggers refused every DELETE on changesets and
revisions. An archive cut moves old changesets into signed segments and then
removes them from the hot tables, so a DELETE now passes when, and only when:

1. the transaction set ``atlas.archiving`` (``SET LOCAL``, transaction-local;
   only ``changesets.archive.hot`` sets it), and
2. a recorded cut covers the row: an ``ArchiveCut`` with ``seq >= OLD.seq``,
   a signature, and in state ``switched`` or ``removed`` — which the archiver
   reaches only after every segment was written, read back and verified.

Every other DELETE is refused as before, and every UPDATE is still the
business of the existing guards (``atlas_log_append_only`` for changesets,
``atlas_revision_guard`` for revisions), whose bodies are not touched: the
old triggers now fire on UPDATE only, and a new trigger per table judges
DELETE. TRUNCATE stays the table owner's (as migration 0002 says).
"""

from django.db import migrations

DELETE_GUARD = r"""
CREATE OR REPLACE FUNCTION atlas_archive_delete_guard() RETURNS trigger AS $$
BEGIN
    IF current_setting('atlas.archiving', true) = 'on' AND EXISTS (
        SELECT 1 FROM changesets_archivecut c
        WHERE c.seq >= OLD.seq AND c.signature <> '' AND c.state IN ('switched', 'removed')
    ) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the changeset log is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

# (table, trigger name of migration 0002/0017, the function it runs on UPDATE)
TABLES = [
    ("changesets_changeset", "changeset", "atlas_log_append_only"),
    ("changesets_revision", "revision", "atlas_revision_guard"),
]


def forward() -> list[str]:
    statements = [DELETE_GUARD]
    for table, short, update_guard in TABLES:
        statements += [
            f"DROP TRIGGER {short}_append_only ON {table};",
            f"CREATE TRIGGER {short}_append_only BEFORE UPDATE ON {table}"
            f" FOR EACH ROW EXECUTE FUNCTION {update_guard}();",
            f"CREATE TRIGGER {short}_delete_guard BEFORE DELETE ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION atlas_archive_delete_guard();",
        ]
    return statements


def reverse() -> list[str]:
    statements = []
    for table, short, update_guard in TABLES:
        statements += [
            f"DROP TRIGGER {short}_delete_guard ON {table};",
            f"DROP TRIGGER {short}_append_only ON {table};",
            f"CREATE TRIGGER {short}_append_only BEFORE UPDATE OR DELETE ON {table}"
            f" FOR EACH ROW EXECUTE FUNCTION {update_guard}();",
        ]
    return [*statements, "DROP FUNCTION atlas_archive_delete_guard();"]


class Migration(migrations.Migration):
    dependencies = [("changesets", "0023_archive")]

    operations = [migrations.RunSQL(forward(), reverse_sql=reverse())]
