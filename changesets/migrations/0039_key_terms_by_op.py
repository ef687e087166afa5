"""The key index tells a whole-image revision's terms from an update's.

A create's (and a delete's) ``changed`` names every top-level member of its
image, so in ``revision_changed_keys`` the posting list of a member set at
create and rarely touched since (``/name``) is every create of the namespace.
Blame asks one question of that list: which revision below its walk last set
the entity's open leaves. ANDed with the entity's history it read both whole:
50 ms at 10M changesets for the scale bench's busy entity, most of it the
namespace's creates (docs/benchmarks.md, "Blame: updates, then the create").

Now a whole-image revision's terms carry their own marks (``+`` for ``=``,
``*`` for ``^``, migration 0013's scheme otherwise), and:

- ``atlas_key_query(branch, namespace, key)`` asks for both kinds: the key
  rule, and every reader of it, is unchanged;
- ``atlas_update_key_query`` asks for an update's terms alone. Blame reads
  those below its walk, and the entity's newest create off
  ``revision_creates``, which sets every leaf there is.

The index is built again (every partition, under the lock ``CREATE INDEX``
takes: writers wait; docs/deploy.md has the time at 10M revisions), then the
table analyzed.
"""

import importlib

from django.db import migrations

KEY_TERMS_BY_OP = r"""
CREATE OR REPLACE FUNCTION atlas_key_terms(branch text, namespace text, changed text, op text)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE COST 1000 AS $$
DECLARE
    head text := branch || chr(31) || namespace || chr(31);
    equal text := '=';
    prefix text := '^';
    terms text[] := '{}';
    parts text[];
    p text;
BEGIN
    IF changed IS NULL THEN
        RETURN terms;
    END IF;
    IF op IN ('create', 'delete') THEN  -- a whole image: its own marks
        equal := '+';
        prefix := '*';
    END IF;
    FOREACH p IN ARRAY string_to_array(changed, '~2') LOOP
        terms := terms || (head || equal || p) || (head || prefix || p);
        IF position('/' IN substr(p, 2)) > 0 THEN  -- nested: its proper prefixes too
            parts := string_to_array(p, '/');
            FOR n IN 2 .. cardinality(parts) - 1 LOOP
                terms := terms || (head || prefix || array_to_string(parts[1:n], '/'));
            END LOOP;
        END IF;
    END LOOP;
    RETURN terms;
END
$$;
"""

# Migration 0013's query, for the way back; renamed, an update's terms for ``key``:
# ``^key`` finds every pointer equal to or inside the key, ``=A`` for each proper
# ancestor A every pointer that contains it.
OLD_KEY_QUERY = importlib.import_module("changesets.migrations.0013_revision_changed").KEY_QUERY
UPDATE_KEY_QUERY = OLD_KEY_QUERY.replace(
    "FUNCTION atlas_key_query(", "FUNCTION atlas_update_key_query("
)

# Both kinds: the key rule of API.md over every revision.
KEY_QUERY = r"""
CREATE OR REPLACE FUNCTION atlas_key_query(branch text, namespace text, key text)
RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY[branch || chr(31) || namespace || chr(31) || '^' || key,
                 branch || chr(31) || namespace || chr(31) || '*' || key] || ARRAY(
        SELECT branch || chr(31) || namespace || chr(31) || mark
               || array_to_string((string_to_array(key, '/'))[1:n], '/')
        FROM generate_series(2, cardinality(string_to_array(key, '/')) - 1) n,
             unnest(ARRAY['=', '+']) AS mark)
$$;
"""


def _index(expression: str) -> str:
    return (
        "CREATE INDEX revision_changed_keys ON changesets_revision"
        f" USING gin ({expression}) WITH (gin_pending_list_limit = 256)"
    )


FORWARD = [
    KEY_TERMS_BY_OP,
    UPDATE_KEY_QUERY,
    "DROP INDEX IF EXISTS revision_changed_keys",
    KEY_QUERY,
    _index("atlas_key_terms(branch, namespace, changed, op)"),
    # The planner's estimates for the new terms (an expression index's statistics
    # come from ANALYZE, which no autovacuum runs for a new index).
    "ANALYZE changesets_revision",
]
BACKWARD = [
    "DROP INDEX IF EXISTS revision_changed_keys",
    OLD_KEY_QUERY,
    _index("atlas_key_terms(branch, namespace, changed)"),
    "DROP FUNCTION IF EXISTS atlas_update_key_query(text, text, text)",
    "DROP FUNCTION IF EXISTS atlas_key_terms(text, text, text, text)",
]


class Migration(migrations.Migration):
    dependencies = [("changesets", "0038_changeset_partitions")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
