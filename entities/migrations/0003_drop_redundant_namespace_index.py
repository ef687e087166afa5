"""Drop ``Entity.namespace``'s own two indexes (B-tree and ``varchar_pattern_ops``):
``entity_key_unique`` leads with ``namespace_id`` and serves the foreign key's
checks and every per-namespace read. Two index inserts fewer per non-HOT entity
update (docs/benchmarks.md, part 1). The foreign key constraint stays."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("entities", "0002_content_is_object"),
    ]

    operations = [
        migrations.AlterField(
            model_name="entity",
            name="namespace",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="entities",
                to="entities.namespace",
            ),
        ),
    ]
