"""Range-partition the changeset table by ``seq``, on the revision table's bounds (issue 21).

An archive cut then drops whole changeset partitions, as it does revision
partitions (``changesets.archive.hot``), instead of deleting changesets in
batches: no long DELETE, no dead tuples, no index to vacuum. The move is
``changesets.repartition`` again (one server-side ``INSERT … SELECT`` per seq
range, a progress bar on stderr, every index, constraint, trigger and extended
statistics object made again from the catalog).

Partitioned, a unique constraint must include ``seq``: the primary key becomes
``(id, seq)`` in the database only (Django keeps ``id``; ids are UUIDv7s made
once per changeset); ``seq`` stays unique on its own.

Foreign keys into the changeset table change (``changesets.partitions``,
``_revision_keys``, says why): a key on a parent that points at a partitioned
table makes every detach of a changeset partition take a SHARE lock on the
referencing table, which writers wait on and deadlock with. So:

- ``revision_changeset_seq`` moves from the revision table's parent to each
  revision partition, pointing at the changeset partition that holds its seqs
  (upkeep keys every partition it makes; a cut drops the revision partition,
  and its key, before the changeset partition);
- the journal entry's key to its changeset goes: the journal is a queue of work
  owed, written in the changeset's own statement and deleted when published;
  the relay already treats an entry whose changeset is gone as ``missing``.

Django's relation from a revision to its changeset joins by seq (a
``ForeignObject``; ``changeset_id`` stays a column), so a join reads the one
partition that holds the changeset.
"""

import sys

from django.db import migrations, models

DJANGO_FK = "changesets_journalen_changeset_id_cd316632_fk_changeset"


def _journal_fk_name(cursor) -> str | None:
    cursor.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'changesets_journalentry'::regclass"
        " AND confrelid = 'changesets_changeset'::regclass AND contype = 'f'"
    )
    row = cursor.fetchone()
    return row[0] if row else None


def forward(apps, schema_editor):
    from atlas import conf
    from changesets import repartition

    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        name = _journal_fk_name(cursor)
        if name:
            cursor.execute(f"ALTER TABLE changesets_journalentry DROP CONSTRAINT {name}")
        moved = repartition.changesets_to_partitioned(
            cursor,
            progress=sys.stderr.isatty(),
            width=max(int(conf.get("ATLAS_LOG_PARTITION_SEQS")), 1),
            ahead=max(int(conf.get("ATLAS_LOG_PARTITIONS_AHEAD")), 1),
        )
    if moved:
        sys.stderr.write(f"\n  moved {moved} changeset(s) onto partitions\n")


def backward(apps, schema_editor):
    from changesets import repartition

    with schema_editor.connection.cursor() as cursor:
        repartition.changesets_to_plain(cursor, progress=sys.stderr.isatty())
        cursor.execute(
            f"ALTER TABLE changesets_journalentry ADD CONSTRAINT {DJANGO_FK} FOREIGN KEY"
            " (changeset_id) REFERENCES changesets_changeset (id) DEFERRABLE INITIALLY DEFERRED"
        )


class Migration(migrations.Migration):
    dependencies = [("changesets", "0037_namespace_seeks")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                # The revision's relation joins by seq; the column keeps the id.
                migrations.RemoveField(model_name="revision", name="changeset"),
                migrations.AddField(
                    model_name="revision",
                    name="changeset_id",
                    field=models.UUIDField(default=None),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name="revision",
                    name="changeset",
                    field=models.ForeignObject(
                        from_fields=("seq",),
                        on_delete=models.DO_NOTHING,
                        related_name="revisions",
                        to="changesets.changeset",
                        to_fields=("seq",),
                    ),
                ),
                migrations.AlterField(
                    model_name="journalentry",
                    name="changeset",
                    field=models.OneToOneField(
                        db_constraint=False,
                        on_delete=models.DO_NOTHING,
                        primary_key=True,
                        related_name="journal",
                        serialize=False,
                        to="changesets.changeset",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        )
    ]
