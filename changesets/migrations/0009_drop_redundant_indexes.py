"""Drop two indexes that only cost writes: ``Revision.changeset``'s (the unique
``revision_one_per_entity_changeset`` leads with ``changeset_id``) and
``Changeset.author``'s (no constraint, no reverse accessor; the author filter
reads ``author_name``). One index insert fewer per revision and per changeset
(docs/benchmarks.md, part 1). The foreign key constraints stay."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("changesets", "0008_loghead_prev_hash"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="changeset",
            name="author",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="revision",
            name="changeset",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="revisions",
                to="changesets.changeset",
            ),
        ),
    ]
