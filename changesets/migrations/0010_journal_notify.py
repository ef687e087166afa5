"""Notify channel ``atlas_journal`` whenever journal entries are inserted.

A statement-level trigger, so every path that writes a journal entry (the
write service, merges, anything later) wakes the journal relay
(``changesets.relay``) at commit, without the write path knowing about it.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION changesets_journal_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('atlas_journal', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER journal_notify AFTER INSERT ON changesets_journalentry
FOR EACH STATEMENT EXECUTE FUNCTION changesets_journal_notify();
"""

DROP = """
DROP TRIGGER IF EXISTS journal_notify ON changesets_journalentry;
DROP FUNCTION IF EXISTS changesets_journal_notify();
"""


class Migration(migrations.Migration):
    dependencies = [("changesets", "0009_drop_redundant_indexes")]

    operations = [migrations.RunSQL(CREATE, DROP)]
