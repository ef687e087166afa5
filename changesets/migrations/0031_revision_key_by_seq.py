"""The revision's foreign key to its changeset goes by ``seq``, and ``revision_changeset`` goes.

Migration 0030 indexed ``changeset_id`` only for the foreign key's check when
a changeset row is deleted (an archive cut): about 30 bytes a revision and
one more index insert on every write, for a lookup no read makes (reads find
a changeset's revisions by its seq, ``changesets.selectors.log.revisions_of``).

A changeset has exactly one seq (unique) and its revisions copy it, so the key
can name the changeset by that copy instead. ``revision_seq_entity`` leads
with seq, so the check on delete is a seek there; and seq is the partition
key, so it touches one partition where a check by ``changeset_id`` probed
every partition's index. ``changeset_id`` stays as a column (reads and the
API name a revision's changeset by it) without a constraint of its own;
``verify_log`` checks that it names the changeset of the revision's seq.

Adding the key validates it: one join of every revision to its changeset
under SHARE ROW EXCLUSIVE locks on both tables (writers wait, readers do not;
PostgreSQL before 18 cannot add it ``NOT VALID`` on a partitioned table).
docs/retention.md ("Migration 0031") has the time on a million revisions.
"""

from django.db import migrations, models

import django.db.models.deletion

FK = "revision_changeset_seq"


class Migration(migrations.Migration):
    dependencies = [("changesets", "0030_revision_changeset_index")]

    operations = [
        migrations.RunSQL(
            f"ALTER TABLE changesets_revision ADD CONSTRAINT {FK} FOREIGN KEY (seq)"
            " REFERENCES changesets_changeset (seq) DEFERRABLE INITIALLY DEFERRED",
            f"ALTER TABLE changesets_revision DROP CONSTRAINT {FK}",
        ),
        migrations.AlterField(
            model_name="revision",
            name="changeset",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="revisions",
                to="changesets.changeset",
            ),
        ),
        migrations.RemoveIndex(model_name="revision", name="revision_changeset"),
    ]
