"""Changed keys on every revision, and the index that answers "who changed this key".

1. ``atlas_changed_keys(before, after)``: the pointer rule of API.md ("Changed
   keys"). For a create or a delete, every top-level member; for an update,
   the deepest object-member paths whose values differ (objects compared
   member by member, arrays and scalars as whole values by their ``jsonb``
   text, so ``1`` and ``1.0`` differ as everywhere in Atlas; a member added
   or removed counts). RFC 6901-escaped, sorted by unescaped segments in code
   point order (``COLLATE "C"`` on the segment array). The log statement
   calls it per row of its revisions insert, so a batch costs no Python loop.
2. ``changesets_revision.changed``, filled for existing rows in batches of
   ids with the append-only trigger switched off inside this migration's
   transaction (as 0005 did for the chain): the one other time log rows are
   updated.
3. ``revision_changed_keys``, a GIN index over ``atlas_key_terms``: per
   changed pointer P, the term ``=P`` and one term ``^Q`` per prefix Q of P
   (P included), each qualified by branch and namespace. The key rule then is
   one overlap with ``atlas_key_query(branch, namespace, key)``: ``^key``
   finds every P equal to or inside the key, ``=A`` for each proper ancestor A
   of the key every P that contains it. Nothing is stored in the row for it:
   the terms live only in the index, and a GIN posting list holds a revision
   in a few bytes per term.
"""

from django.contrib.postgres.fields import ArrayField
from django.db import migrations, models

CHANGED_KEYS = r"""
CREATE OR REPLACE FUNCTION atlas_changed_keys(before jsonb, after jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF before IS NULL OR after IS NULL THEN
        RETURN ARRAY(
            SELECT '/' || replace(replace(k, '~', '~0'), '/', '~1')
            FROM jsonb_object_keys(COALESCE(after, before, '{}'::jsonb)) AS k
            ORDER BY k COLLATE "C");
    END IF;
    RETURN ARRAY(
        WITH RECURSIVE node(path, pointer, b, a) AS (
            SELECT ARRAY[k], '/' || replace(replace(k, '~', '~0'), '/', '~1'),
                   before -> k, after -> k
            FROM jsonb_object_keys(before || after) AS k
            WHERE (before -> k)::text IS DISTINCT FROM (after -> k)::text
          UNION ALL
            SELECT n.path || k, n.pointer || '/' || replace(replace(k, '~', '~0'), '/', '~1'),
                   n.b -> k, n.a -> k
            FROM node n, jsonb_object_keys(n.b || n.a) AS k
            WHERE jsonb_typeof(n.b) = 'object' AND jsonb_typeof(n.a) = 'object'
              AND (n.b -> k)::text IS DISTINCT FROM (n.a -> k)::text
        )
        SELECT pointer FROM node
        WHERE jsonb_typeof(b) IS DISTINCT FROM 'object'
           OR jsonb_typeof(a) IS DISTINCT FROM 'object'
        ORDER BY path COLLATE "C");
END
$$;
"""

# chr(31) cannot occur in a branch or namespace name, so a term names its
# (branch, namespace) unambiguously; the pointer comes last. PL/pgSQL: the index
# computes it for every revision written, and a loop is three times faster here
# than the set-returning SQL of atlas_key_query (which runs once per query).
# COST 1000: as a filter (walking the seq index newest first) it costs a heap
# fetch per row; at the default cost the planner walked 300,000 rows for a key
# changed once in 1,000 revisions (190 ms) instead of reading the index (5 ms).
KEY_TERMS = r"""
CREATE OR REPLACE FUNCTION atlas_key_terms(branch text, namespace text, changed text[])
RETURNS text[] LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE COST 1000 AS $$
DECLARE
    head text := branch || chr(31) || namespace || chr(31);
    terms text[] := '{}';
    parts text[];
    p text;
BEGIN
    -- NULL only in the rows' old versions during this migration: CREATE INDEX
    -- also indexes the versions the backfill's UPDATE has just replaced.
    IF changed IS NULL THEN
        RETURN terms;
    END IF;
    FOREACH p IN ARRAY changed LOOP
        terms := terms || (head || '=' || p) || (head || '^' || p);
        IF position('/' IN substr(p, 2)) > 0 THEN  -- nested: its proper prefixes too
            parts := string_to_array(p, '/');
            FOR n IN 2 .. cardinality(parts) - 1 LOOP
                terms := terms || (head || '^' || array_to_string(parts[1:n], '/'));
            END LOOP;
        END IF;
    END LOOP;
    RETURN terms;
END
$$;
"""

KEY_QUERY = r"""
CREATE OR REPLACE FUNCTION atlas_key_query(branch text, namespace text, key text)
RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY[branch || chr(31) || namespace || chr(31) || '^' || key] || ARRAY(
        SELECT branch || chr(31) || namespace || chr(31) || '='
               || array_to_string((string_to_array(key, '/'))[1:n], '/')
        FROM generate_series(2, cardinality(string_to_array(key, '/')) - 1) n)
$$;
"""

DROP_FUNCTIONS = [
    "DROP FUNCTION IF EXISTS atlas_key_query(text, text, text)",
    "DROP FUNCTION IF EXISTS atlas_key_terms(text, text, text[])",
    "DROP FUNCTION IF EXISTS atlas_changed_keys(jsonb, jsonb)",
]

# New entries wait in GIN's pending list (cheap inserts) until it is merged into
# the compact posting lists; 256 kB instead of the default 4 MB bounds what waits
# uncompressed (a few thousand revisions) and each merge's pause.
INDEX = (
    "CREATE INDEX revision_changed_keys ON changesets_revision"
    " USING gin (atlas_key_terms(branch, namespace, changed))"
    " WITH (gin_pending_list_limit = 256)"
)

BATCH = 10_000


def backfill(apps, schema_editor):
    """Existing revisions' ``changed``, ``BATCH`` ids per statement (bounded work each)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT min(id), max(id) FROM changesets_revision")
        low, high = cursor.fetchone()
        if low is None:
            return
        cursor.execute("ALTER TABLE changesets_revision DISABLE TRIGGER revision_append_only")
        for start in range(low, high + 1, BATCH):
            cursor.execute(
                "UPDATE changesets_revision SET changed = atlas_changed_keys(before, after)"
                " WHERE id >= %s AND id < %s",
                [start, start + BATCH],
            )
        cursor.execute("ALTER TABLE changesets_revision ENABLE TRIGGER revision_append_only")


class Migration(migrations.Migration):
    dependencies = [("changesets", "0012_journal_seq")]

    operations = [
        migrations.RunSQL([CHANGED_KEYS, KEY_TERMS, KEY_QUERY], DROP_FUNCTIONS),
        migrations.AddField(
            model_name="revision",
            name="changed",
            field=ArrayField(models.TextField(), null=True, size=None),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="revision",
            name="changed",
            field=ArrayField(models.TextField(), default=list, size=None),
        ),
        migrations.RunSQL(INDEX, "DROP INDEX IF EXISTS revision_changed_keys"),
    ]
