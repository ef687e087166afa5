"""Journal entries leave the table once published (issue 16 item 6, "half the bytes").

Publishing now deletes an entry instead of marking it ``published``
(``changesets.outbox.journal``): nothing ever read a published entry again, and
keeping one cost 144 bytes per write (row, primary key). This migration:

1. makes ``JournalTally`` and seeds its ``failures`` with the sum of every
   entry's ``failures``, before any entry goes, so ``atlas_journal_failures_total``
   goes on from where it was (it used to be that sum, which deleting published
   entries would shrink; a Prometheus counter must never go down);
2. deletes the published entries in batches of ``BATCH`` along the primary key
   (an index range each, so a batch costs the same at the start and the end of a
   table of millions), each batch committed on its own: no transaction holds
   locks, or the vacuum horizon, for minutes; a progress bar on stderr;
3. drops ``journal_failed`` (it served only the old sum);
4. sets the table's autovacuum to suit a queue (see ``AUTOVACUUM``).

The migration is not atomic (step 2 commits as it goes), so every step is
written to be run again: a migrate stopped halfway is finished by the next one.
The table's file keeps its size after step 2 (the freed space is reused by new
entries); ``VACUUM FULL changesets_journalentry`` gives it back to the operating
system, under an exclusive lock held for as long as it reads the old file.

The reverse keeps the deleted entries deleted (they held nothing anything reads)
and puts back the index and the default autovacuum settings.
"""

import sys

from django.db import migrations, models, transaction
from tqdm import tqdm

# Entries per DELETE (one progress step; about a tenth of a second each).
BATCH = 10_000

# A queue table's live rows say nothing about its churn: at steady state it holds
# a handful of rows, while every write inserts one and every publish deletes it.
# The default trigger (50 dead rows + 20% of the live ones) then depends on the
# size of the last backlog, and after a backlog of a million entries it waits for
# 200,000 dead rows. A fixed threshold (scale factor 0) has autovacuum visit the
# table whenever 1,000 entries have been deleted since its last visit, at most
# once per autovacuum_naptime: a pass over a table of a few pages, whose freed
# space the next inserts reuse, so the table stays a few pages whatever the
# write rate.
AUTOVACUUM = {"autovacuum_vacuum_scale_factor": "0", "autovacuum_vacuum_threshold": "1000"}

_SEED = (
    "INSERT INTO changesets_journaltally (id, failures)"
    " SELECT 1, COALESCE(sum(failures), 0) FROM changesets_journalentry"
    " ON CONFLICT (id) DO NOTHING"
)

# The next BATCH entries along the primary key after %(after)s, the published
# among them deleted: (last key seen, entries deleted, entries seen).
_DELETE_BATCH = """
WITH span AS (
    SELECT changeset_id, phase FROM changesets_journalentry
    WHERE changeset_id > %(after)s::uuid ORDER BY changeset_id LIMIT %(batch)s
), gone AS (
    DELETE FROM changesets_journalentry j USING span
    WHERE j.changeset_id = span.changeset_id AND span.phase = 'published'
    RETURNING 1
)
SELECT
    (SELECT changeset_id FROM span ORDER BY changeset_id DESC LIMIT 1),
    (SELECT count(*) FROM gone)
"""

_FIRST_KEY = "00000000-0000-0000-0000-000000000000"


def delete_published(cursor, *, batch, progress=False):
    """Step 2: delete every published entry, ``batch`` at a time; how many.

    Each statement commits on its own when the connection is in autocommit (as
    in this migration); nothing here holds a lock beyond its batch."""
    cursor.execute("SELECT count(*) FROM changesets_journalentry WHERE phase = 'published'")
    total = cursor.fetchone()[0]
    if not total:
        return 0
    deleted, after = 0, _FIRST_KEY
    with tqdm(
        total=total, unit="entry", desc="delete published journal entries", disable=not progress
    ) as bar:
        while True:
            cursor.execute(_DELETE_BATCH, {"after": after, "batch": batch})
            last, gone = cursor.fetchone()
            if last is None:
                return deleted
            deleted += gone
            bar.update(gone)
            after = str(last)


def forward(apps, schema_editor):
    connection = schema_editor.connection
    tally = apps.get_model("changesets", "JournalTally")
    with transaction.atomic(using=connection.alias):
        if tally._meta.db_table not in connection.introspection.table_names():
            schema_editor.create_model(tally)
        with connection.cursor() as cursor:
            cursor.execute(_SEED)
    with connection.cursor() as cursor:
        deleted = delete_published(cursor, batch=BATCH, progress=sys.stderr.isatty())
        cursor.execute("DROP INDEX IF EXISTS journal_failed")
        params = ", ".join(f"{k} = {v}" for k, v in AUTOVACUUM.items())
        cursor.execute(f"ALTER TABLE changesets_journalentry SET ({params})")
    if deleted:
        sys.stderr.write(f"\n  deleted {deleted} published journal entr(ies)\n")


def backward(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE changesets_journalentry RESET ({', '.join(AUTOVACUUM)})")
        cursor.execute(
            "CREATE INDEX IF NOT EXISTS journal_failed ON changesets_journalentry (failures)"
            " WHERE failures > 0"
        )
    tally = apps.get_model("changesets", "JournalTally")
    if tally._meta.db_table in connection.introspection.table_names():
        schema_editor.delete_model(tally)


class Migration(migrations.Migration):
    # Step 2 commits batch by batch; every step can run again (module docstring).
    atomic = False

    dependencies = [("changesets", "0025_revision_partitions")]

    operations = [
        # The state here; the database in forward(), which can be run twice.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="JournalTally",
                    fields=[
                        (
                            "id",
                            models.PositiveSmallIntegerField(
                                default=1, primary_key=True, serialize=False
                            ),
                        ),
                        ("failures", models.BigIntegerField(default=0)),
                    ],
                    options={
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(("id", 1)), name="journaltally_single_row"
                            )
                        ],
                    },
                ),
                migrations.RemoveIndex(model_name="journalentry", name="journal_failed"),
            ],
        ),
        migrations.RunPython(forward, backward),
    ]
