from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("entities", "0001_initial")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE entities_entity ADD CONSTRAINT entity_content_is_object"
            " CHECK (jsonb_typeof(content) = 'object');",
            reverse_sql="ALTER TABLE entities_entity DROP CONSTRAINT entity_content_is_object;",
        )
    ]
