"""Provenance on every changeset: the client's ``metadata`` and the request's ``context``.

Two nullable ``jsonb`` columns: adding them rewrites nothing (PostgreSQL only
records the columns; existing rows read them as NULL) and a row without them
costs nothing but its null bitmap. The chain commits to them when they are set
(``changesets.chain``), so changesets written before this keep verifying.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("changesets", "0014_changeset_ascending_indexes")]

    operations = [
        migrations.AddField(
            model_name="changeset",
            name="metadata",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="changeset",
            name="context",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
