# The trash (GET /entities?deleted=true, the admin's "Deleted" view) walks the keys
# ever deleted on baseline, in key order, newest delete first.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("changesets", "0018_rechain_v2"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="revision",
            index=models.Index(
                condition=models.Q(("op", "delete")),
                fields=["branch", "namespace", "kind", "slug", "-seq"],
                name="revision_deletes",
            ),
        ),
    ]
