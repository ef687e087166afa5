"""An index on revisions' ``changeset_id``, for the foreign key's check on delete.

Migration 0028 dropped ``revision_one_per_entity_changeset``, the last index
that led with ``changeset_id``: reads find a changeset's revisions by its seq.
But deleting a changeset row (an archive cut's removal, ``changesets.archive.
hot``) makes PostgreSQL check the foreign key with ``SELECT 1 FROM
changesets_revision WHERE changeset_id = $1``, once per deleted changeset, and
with no index that is a scan of every hot revision: quadratic in the cut. At
7.9M changesets one batch of 2,000 had not committed after ten minutes.

On the partitioned table ``CREATE INDEX`` makes (or adopts: an index on the
same column that an operator built beforehand ``CONCURRENTLY``, docs/
retention.md) one index per partition, each under a SHARE lock: writers wait
for the builds, readers do not.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("changesets", "0029_revision_before_delta")]

    operations = [
        migrations.AddIndex(
            model_name="revision",
            index=models.Index(fields=["changeset"], name="revision_changeset"),
        ),
    ]
