"""A changeset's message is left to the rule: NULL stored, filled in on read.

Atlas writes one message, ``"<rpc>: <op_count> change(s)"``
(``changesets.models.default_message``), and both its parts are columns of
the row. Stored, it cost about 23 bytes a changeset (issue 16, "half the
bytes"). From this migration the log statement leaves the column NULL and
``Changeset.from_db`` fills it in; SQL that reads the column itself spells the
rule (``MESSAGE_SQL``). The chain hashes the text, as it always did, so a
stored NULL verifies like the text it stands for. Rows written before keep
their text: nothing is rewritten, and dropping NOT NULL is a catalog change.

Backwards, the NULLs become the rule's text again before NOT NULL returns
(an UPDATE of the log, which its append-only trigger allows here only).
"""

from django.db import migrations, models

FILL = (
    "ALTER TABLE changesets_changeset DISABLE TRIGGER changeset_append_only;"
    " UPDATE changesets_changeset SET message = rpc || ': ' || op_count || ' change(s)'"
    " WHERE message IS NULL;"
    " ALTER TABLE changesets_changeset ENABLE TRIGGER changeset_append_only;"
)


class Migration(migrations.Migration):
    dependencies = [("changesets", "0032_time_bound_by_search")]

    # Reversed last first: the NULLs are filled before NOT NULL returns.
    operations = [
        migrations.AlterField(
            model_name="changeset",
            name="message",
            field=models.CharField(max_length=200, null=True),
        ),
        migrations.RunSQL(migrations.RunSQL.noop, FILL),
    ]
