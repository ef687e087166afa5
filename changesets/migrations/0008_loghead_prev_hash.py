"""``LogHead.prev_hash``: the write path draws seq and computes the chain hash in
one statement, and the changeset row it inserts needs the hash before it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("changesets", "0007_revision_asof_index")]

    operations = [
        migrations.AddField(
            model_name="loghead",
            name="prev_hash",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
    ]
