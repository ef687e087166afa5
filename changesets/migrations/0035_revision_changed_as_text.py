"""A revision's ``changed`` pointers are stored as one text, not a ``text[]``.

An array of one pointer (``{/price}``) took 33 bytes on disk, 24 of them its
header (dimensions, bounds, element type); the same pointer as text is the
pointer and a byte, about 26 bytes less on every update's revision (issue 16,
"half the bytes"). Several pointers are joined by ``~2``, which cannot occur
inside a pointer (RFC 6901 escapes "~" as "~0" and "/" as "~1"), so the text
splits back exactly (``changesets.fields.PointerListField``; in SQL,
``string_to_array(changed, '~2')``; the empty list is the empty text).

The key index, ``revision_changed_keys``, keeps its expression,
``atlas_key_terms(branch, namespace, changed)``: a ``text`` overload splits
and calls the ``text[]`` one, so queries spell the same expression (PL/pgSQL,
so the planner never inlines one side of the match and not the other). The
column's type change rewrites the revision table (every partition) under an
ACCESS EXCLUSIVE lock, and the index is built again after it; docs/retention.md
has the time on a million revisions.
"""

from django.db import migrations

import changesets.fields

KEY_TERMS_TEXT = """
CREATE OR REPLACE FUNCTION atlas_key_terms(branch text, namespace text, changed text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE COST 1000 AS $$
BEGIN
    RETURN atlas_key_terms(branch, namespace, string_to_array(changed, '~2'));
END
$$;
"""
INDEX = (
    "CREATE INDEX revision_changed_keys ON changesets_revision"
    " USING gin (atlas_key_terms(branch, namespace, changed))"
    " WITH (gin_pending_list_limit = 256)"
)
FORWARD = [
    KEY_TERMS_TEXT,
    "DROP INDEX IF EXISTS revision_changed_keys",
    "ALTER TABLE changesets_revision ALTER COLUMN changed DROP DEFAULT,"
    " ALTER COLUMN changed TYPE text USING array_to_string(changed, '~2')",
    INDEX,
]
BACKWARD = [
    "DROP INDEX IF EXISTS revision_changed_keys",
    "ALTER TABLE changesets_revision ALTER COLUMN changed TYPE text[]"
    " USING string_to_array(changed, '~2')",
    INDEX,
    "DROP FUNCTION IF EXISTS atlas_key_terms(text, text, text)",
]


class Migration(migrations.Migration):
    dependencies = [("changesets", "0034_changeset_prev_hash_derived")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.AlterField(
                    model_name="revision",
                    name="changed",
                    field=changesets.fields.PointerListField(default=list),
                ),
            ],
        ),
    ]
