"""PostgreSQL refuses entity rows written by anything but the write service
(DESIGN invariant 1; ``entities/writer.py`` explains the marker).

``atlas_entity_write_guard`` runs before each inserted, updated or deleted row
of ``entities_entity``: the row passes only while ``atlas.writer`` is the
write service's marker for the row's changeset (``cs:<changeset_id>``; any
``cs:`` marker for a delete). ``atlas_writer_done(n)`` clears the marker and
returns ``n``: the log statement calls it on its count of written rows.
TRUNCATE is left alone: it is the table owner's act (and Django's test flush),
as for the log's append-only guard (changesets 0002).
"""

from django.db import migrations

WRITER_DONE = """
CREATE OR REPLACE FUNCTION atlas_writer_done(n bigint) RETURNS bigint AS $$
BEGIN
    PERFORM set_config('atlas.writer', '', true);
    RETURN n;
END;
$$ LANGUAGE plpgsql VOLATILE;
"""

ENTITY_GUARD = """
CREATE OR REPLACE FUNCTION atlas_entity_write_guard() RETURNS trigger AS $$
DECLARE
    marker text := current_setting('atlas.writer', true);
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF marker LIKE 'cs:%' THEN
            RETURN OLD;
        END IF;
    ELSIF marker = 'cs:' || NEW.changeset_id::text THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION
        'Atlas refused % on %: entity rows change only through the write service, so that every write is a changeset',
        TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Call changesets.services.changeset_apply(store=..., actor=..., ops=[...], rpc=...) '
                     'instead of saving, updating or deleting Entity rows (ORM or SQL) directly.';
END;
$$ LANGUAGE plpgsql;
"""

FORWARD = [
    WRITER_DONE,
    ENTITY_GUARD,
    "CREATE TRIGGER entity_write_guard BEFORE INSERT OR UPDATE OR DELETE ON entities_entity"
    " FOR EACH ROW EXECUTE FUNCTION atlas_entity_write_guard();",
]
REVERSE = [
    "DROP TRIGGER IF EXISTS entity_write_guard ON entities_entity;",
    "DROP FUNCTION IF EXISTS atlas_entity_write_guard();",
    "DROP FUNCTION IF EXISTS atlas_writer_done(bigint);",
]


class Migration(migrations.Migration):
    dependencies = [
        ("entities", "0003_drop_redundant_namespace_index"),
    ]

    operations = [migrations.RunSQL(FORWARD, reverse_sql=REVERSE)]
