"""The journal entry carries its changeset's ``seq``; outstanding entries are
indexed by it (``journal_pending``) in place of ``created_at``.

The relay reads "the next outstanding entries in seq order" on every wake.
Joined through ``changesets_changeset`` that read grew with the backlog (48 ms
at 10,000 outstanding); on the entry's own seq it is one index seek whatever
the backlog. ``created_at`` is not decreasing in seq order (the log head never
moves ``at`` backwards), so "oldest first" reads the same index.
"""

from django.db import migrations, models

BACKFILL = """
UPDATE changesets_journalentry j SET seq = c.seq
FROM changesets_changeset c WHERE c.id = j.changeset_id
"""


class Migration(migrations.Migration):
    dependencies = [("changesets", "0011_subscription_parts_parking_rotation")]

    operations = [
        migrations.AddField(
            model_name="journalentry",
            name="seq",
            field=models.BigIntegerField(null=True),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="journalentry",
            name="seq",
            field=models.BigIntegerField(),
        ),
        migrations.RemoveIndex(model_name="journalentry", name="journal_outstanding"),
        migrations.AddIndex(
            model_name="journalentry",
            index=models.Index(
                condition=models.Q(("phase", "committed")),
                fields=["seq"],
                name="journal_pending",
            ),
        ),
    ]
