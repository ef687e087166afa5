"""``Revision.at``: the changeset's time copied onto each revision row.

As-of reads need each entity's ``created_at`` and ``updated_at``, which are
the times of two of its revisions' changesets; with the time on the revision
row they need no probe of the changeset table (two index probes per entity of
a page before). ``verify_log`` checks the copy against the changeset.

The backfill is one set-based UPDATE with the append-only trigger switched
off inside this migration's transaction (table owner only), like 0005's.
The ``revision_creates`` index now carries ``at``, so the as-of key walk
(newest create at or before X per key, and its time) reads the index only.
"""

from django.db import migrations, models

BACKFILL = """
ALTER TABLE changesets_revision DISABLE TRIGGER revision_append_only;
UPDATE changesets_revision r SET at = c.at FROM changesets_changeset c WHERE c.id = r.changeset_id;
ALTER TABLE changesets_revision ENABLE TRIGGER revision_append_only;
"""


class Migration(migrations.Migration):
    dependencies = [("changesets", "0005_hash_chain")]

    operations = [
        migrations.AddField(
            model_name="revision",
            name="at",
            field=models.DateTimeField(null=True),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="revision",
            name="at",
            field=models.DateTimeField(),
        ),
    ]
