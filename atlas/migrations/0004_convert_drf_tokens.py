"""Convert DRF's stock tokens (``rest_framework.authtoken``) to hashed ``ApiToken`` rows.

Clients keep their keys: each old key becomes a token whose digest is the
key's SHA-256 (``atlas.tokens.key_digest``) and whose prefix is its first 8
characters (``key_prefix``), so ``Authorization: Token <old key>`` still
authenticates. Then the old table, the one place keys were kept in clear,
is dropped, and its app's migration records with it (the app is no longer
installed; were it ever installed again, it would start from a fresh table).
A database that never had the table (a new install) has nothing to convert.
Not reversible: the keys are gone once only their digests remain.
"""

from django.db import migrations

OLD_TABLE = "authtoken_token"
CONVERTED_NAME = "converted DRF token"

CONVERT = f"""
INSERT INTO atlas_apitoken (user_id, name, prefix, digest, created_at)
SELECT user_id, %s, left(key, 8), encode(sha256(convert_to(key, 'UTF8')), 'hex'), created
FROM {OLD_TABLE}
ON CONFLICT (digest) DO NOTHING
"""


def convert_drf_tokens(apps, schema_editor) -> None:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if OLD_TABLE not in connection.introspection.table_names(cursor):
            return
        cursor.execute(CONVERT, [CONVERTED_NAME])
        cursor.execute(f"DROP TABLE {OLD_TABLE}")
        cursor.execute("DELETE FROM django_migrations WHERE app = %s", ["authtoken"])


class Migration(migrations.Migration):
    dependencies = [("atlas", "0003_api_token")]

    operations = [migrations.RunPython(convert_drf_tokens, migrations.RunPython.noop)]
