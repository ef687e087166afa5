from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("atlas", "0004_convert_drf_tokens"),
    ]

    operations = [
        migrations.AddField(
            model_name="idempotencyrecord",
            name="lease_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
