"""Range-partition the revision table by ``seq`` (issue 21, phase 2; ``changesets.repartition``).

Moves an existing table onto partitions of ``ATLAS_LOG_PARTITION_SEQS`` seqs,
one server-side ``INSERT … SELECT`` per seq range (bounded memory, a progress
bar on stderr), with ``ATLAS_LOG_PARTITIONS_AHEAD`` empty partitions past the
head; every index, constraint and trigger is made again from the catalog.
The primary key becomes ``(id, seq)`` in the database only (Django keeps
``id``); ``seq`` joins ``revision_one_per_entity_changeset`` in both. The
reverse moves the rows back into one plain table.
"""

import sys

from django.db import migrations, models


def forward(apps, schema_editor):
    from atlas import conf
    from changesets import repartition

    with schema_editor.connection.cursor() as cursor:
        moved = repartition.to_partitioned(
            cursor,
            progress=sys.stderr.isatty(),
            width=max(int(conf.get("ATLAS_LOG_PARTITION_SEQS")), 1),
            ahead=max(int(conf.get("ATLAS_LOG_PARTITIONS_AHEAD")), 1),
        )
    if moved:
        sys.stderr.write(f"\n  moved {moved} revision(s) onto partitions\n")


def backward(apps, schema_editor):
    from changesets import repartition

    with schema_editor.connection.cursor() as cursor:
        repartition.to_plain(cursor, progress=sys.stderr.isatty())


class Migration(migrations.Migration):
    dependencies = [("changesets", "0024_archive_delete_guard")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="revision", name="revision_one_per_entity_changeset"
                ),
                migrations.AddConstraint(
                    model_name="revision",
                    constraint=models.UniqueConstraint(
                        fields=("changeset", "namespace", "kind", "slug", "seq"),
                        name="revision_one_per_entity_changeset",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        )
    ]
