"""``atlas_write_moved(moved)``: the unlocked write's refusal, raised inside its statement.

A single-entity write outside any transaction reads its row without a lock and
writes it back in one autocommit statement that commits as it ends
(``changesets.services.apply``, "one round trip to commit"). Its entity CTEs
write only rows still at the version it read; when one did not (the row moved,
went, or a create lost its race), the log head does not move and the
statement's result calls this function, which raises ``serialization_failure``
(40001). The error aborts the statement, so the rows it did write are rolled
back with it, and the service retries the whole write the locked way, as it
retries any serialization failure.

VOLATILE (the default), so the planner never folds or skips the call.
"""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION atlas_write_moved(moved boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF moved THEN
        RAISE EXCEPTION 'an entity this write read moved before the write: retrying it locked'
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN moved;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("changesets", "0035_revision_changed_as_text")]

    operations = [
        migrations.RunSQL(FUNCTION, "DROP FUNCTION IF EXISTS atlas_write_moved(boolean)"),
    ]
