from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("number", models.CharField(max_length=40, unique=True)),
                ("total", models.IntegerField()),
                ("changeset_id", models.UUIDField()),
            ],
        ),
    ]
