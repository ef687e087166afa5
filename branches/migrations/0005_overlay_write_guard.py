"""PostgreSQL refuses branch overlay rows written by anything but the write
service (DESIGN invariant 1; ``entities/writer.py`` explains the marker).

Like ``entity_write_guard`` (entities 0004): an inserted or updated overlay
row passes only under the write service's marker for its changeset
(``cs:<changeset_id>``); a deleted one only while its branch is being closed
(``close:<branch_id>``, set by ``branches.store.close_branch``); and a sync
(``sync:<branch_id>``, ``branches.sync.move_base_point``) may change nothing
of a row but its ``base_version``.
"""

from django.db import migrations

OVERLAY_GUARD = """
CREATE OR REPLACE FUNCTION atlas_overlay_write_guard() RETURNS trigger AS $$
DECLARE
    marker text := current_setting('atlas.writer', true);
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF marker = 'close:' || OLD.branch_id::text THEN
            RETURN OLD;
        END IF;
    ELSIF marker = 'cs:' || NEW.changeset_id::text THEN
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' AND marker = 'sync:' || OLD.branch_id::text
        AND (NEW.id, NEW.branch_id, NEW.namespace_id, NEW.kind, NEW.slug, NEW.content,
             NEW.deleted, NEW.version, NEW.created_at, NEW.updated_at, NEW.changeset_id)
            IS NOT DISTINCT FROM
            (OLD.id, OLD.branch_id, OLD.namespace_id, OLD.kind, OLD.slug, OLD.content,
             OLD.deleted, OLD.version, OLD.created_at, OLD.updated_at, OLD.changeset_id) THEN
        RETURN NEW;  -- a sync moves only the row's base version (branches.sync)
    END IF;
    RAISE EXCEPTION
        'Atlas refused % on %: branch overlay rows change only through the write service, so that every write is a changeset',
        TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Write a branch with changesets.services.changeset_apply(store=BranchStore(branch), ...); '
                     'close one with branches.services.branch_merge() or branch_abandon().';
END;
$$ LANGUAGE plpgsql;
"""

FORWARD = [
    OVERLAY_GUARD,
    "CREATE TRIGGER overlay_write_guard BEFORE INSERT OR UPDATE OR DELETE"
    " ON branches_branchentity FOR EACH ROW EXECUTE FUNCTION atlas_overlay_write_guard();",
]
REVERSE = [
    "DROP TRIGGER IF EXISTS overlay_write_guard ON branches_branchentity;",
    "DROP FUNCTION IF EXISTS atlas_overlay_write_guard();",
]


class Migration(migrations.Migration):
    # Needs atlas_writer_done() (entities 0004) at run time, not to migrate; the
    # dependency keeps the two guards arriving together.
    dependencies = [
        ("branches", "0003_branch_base_point"),
        ("entities", "0004_entity_write_guard"),
    ]

    operations = [migrations.RunSQL(FORWARD, reverse_sql=REVERSE)]
